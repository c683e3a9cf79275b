"""A tiny trainer for launcher tests: every worker adds 1 to one variable on ps:0, a few times.

It reads its cluster and task from TF_CONFIG. Each worker then waits (bounded)
until the counter holds every worker's increments, which proves that all of
them reached the same variable on the same ps, and tells the ps it is done,
as fit does.

  --fail-task worker:1 --exit-code 3   that task exits 3 at once
  --die-first-run worker:1             that task serves, prints "ready to be killed" and
                                       sleeps on its first run (TFCLUSTER_RESTART_COUNT=0)
"""
import argparse
import json
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3)
p.add_argument("--fail-task")
p.add_argument("--exit-code", type=int, default=3)
p.add_argument("--die-first-run")
args = p.parse_args()

spec = json.loads(os.environ["TF_CONFIG"])
me = f"{spec['task']['type']}:{spec['task']['index']}"
print(f"pid {os.getpid()}", flush=True)
if args.fail_task == me:
    print(f"{me} fails on purpose with code {args.exit_code}", flush=True)
    sys.exit(args.exit_code)

import tfcluster  # noqa: E402

cluster, server = tfcluster.server_from_tf_config(timeout=90)
if args.die_first_run == me and os.environ.get("TFCLUSTER_RESTART_COUNT", "0") == "0":
    print("ready to be killed", flush=True)
    time.sleep(300)
    sys.exit(1)

import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
workers = cluster.num_tasks("worker")
total = workers * args.steps
with tf1.Graph().as_default():
    with tf1.device("/job:ps/task:0"):
        counter = tf1.Variable(0, dtype=tf.int64, name="counter")
    ready = tf1.is_variable_initialized(counter)
    add = counter.assign_add(1)
    with tf1.Session(server.target, config=cluster.session_config()) as sess:
        if cluster.is_chief:
            sess.run(counter.initializer)
        deadline = time.monotonic() + 90
        while not sess.run(ready):
            if time.monotonic() > deadline:
                sys.exit(f"{me}: the chief never initialised the counter")
            time.sleep(0.1)
        for step in range(args.steps):
            print(f"step {step + 1} counter={sess.run(add)}", flush=True)
        while sess.run(counter) < total:
            if time.monotonic() > deadline:
                sys.exit(f"{me}: counter stuck at {sess.run(counter)} of {total}")
            time.sleep(0.1)
        print(f"total {sess.run(counter)}", flush=True)
tfcluster.signal_done(cluster)
