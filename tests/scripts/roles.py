"""Prints what the launcher gave this task (TF_CONFIG, argv, env, GPUs and threads), then plays its role.

Trainers (chief, master, worker, and jobs of no role) exit 0 at once. A ps
started in the legacy-flags convention, and the evaluator, block forever, like
``server.join()``.

A test that reads what a ps or the evaluator printed sets ROLES_MARKS (a dir)
and ROLES_WAIT_FOR (``ps-0,evaluator-0``): the ps and the evaluator mark
there that they printed, and the trainers end only once those have (60 s at
most), as a TF 1.x trainer ends only after it reached the ps. Otherwise the launcher may stop a ps
that is still importing TensorFlow when the trainers are already done.
"""
import json
import os
import sys
import time

spec = json.loads(os.environ["TF_CONFIG"])
print("pid", os.getpid(), flush=True)
print("TF_CONFIG", json.dumps(spec, sort_keys=True), flush=True)
print("ARGV", json.dumps(sys.argv[1:]), flush=True)
print("REUSE", os.environ.get("TF_GRPC_REUSE_PORT"), "RESTART", os.environ.get("TFCLUSTER_RESTART_COUNT"),
      flush=True)
print("RESOURCES", json.dumps({k: os.environ.get(k) for k in (
    "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS",
    "OMP_NUM_THREADS")}, sort_keys=True), flush=True)
MARKS = os.environ.get("ROLES_MARKS")
if spec["task"]["type"] in ("ps", "evaluator"):
    print("blocking forever", flush=True)
    if MARKS:
        open(os.path.join(MARKS, f"{spec['task']['type']}-{spec['task']['index']}"), "w").close()
    time.sleep(600)
elif MARKS:
    deadline = time.monotonic() + 60
    waits = [os.path.join(MARKS, name) for name in os.environ["ROLES_WAIT_FOR"].split(",")]
    while not all(map(os.path.exists, waits)) and time.monotonic() < deadline:
        time.sleep(0.05)
