"""Prints what the launcher gave this task (TF_CONFIG, argv, env), then plays its role.

Trainers (chief, worker) exit 0 at once. Any other role (a ps started in the
legacy-flags convention, the evaluator) blocks forever, like ``server.join()``.
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
if spec["task"]["type"] not in ("chief", "worker"):
    print("blocking forever", flush=True)
    time.sleep(600)
