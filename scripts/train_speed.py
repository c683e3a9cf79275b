#!/usr/bin/env python3
"""Throughput of tfcluster's parameter-server training, per worker, sync and async.

    python scripts/train_speed.py                 # MLP 784-512-10, batch 128, 1 ps + 2 workers
    python scripts/train_speed.py --modes async --steps 4000

For each mode it starts a cluster by hand (a ps with ``tfcluster start``, two
workers running this script with TF_CONFIG) and reports, per worker:

- launch -> first step: seconds from starting that worker's process to the end
  of its first training step (TF import, graph, session, readiness wait);
- examples/s over the window in which BOTH workers were stepping (from each
  worker's half-second step timeline), so that a late starter or an early
  finisher does not distort the figure; and over its whole loop.

Data is random, in memory, fed through tf.data (no feed_dict).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


# ------------------------------------------------------------------ a worker
def worker(cfg_path):
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    import numpy as np
    import tensorflow as tf
    tf1 = tf.compat.v1
    from tfcluster.cli import setup_logging
    from tfcluster.strategies import ModelOutput, ParameterServerStrategy
    from tfcluster.train import fit
    setup_logging()
    rng = np.random.RandomState(0)
    x = rng.rand(8192, 784).astype("float32")
    y = rng.randint(0, 10, 8192).astype("int64")

    def model_fn(features, labels, mode):
        w1 = tf1.get_variable("hidden/w", [784, 512], initializer=tf1.glorot_uniform_initializer(seed=1))
        b1 = tf1.get_variable("hidden/b", [512], initializer=tf1.zeros_initializer())
        w2 = tf1.get_variable("out/w", [512, 10], initializer=tf1.glorot_uniform_initializer(seed=2))
        b2 = tf1.get_variable("out/b", [10], initializer=tf1.zeros_initializer())
        h = tf.nn.relu(tf.matmul(features, w1) + b1)
        logits = tf.matmul(h, w2) + b2
        return ModelOutput(predictions=tf.argmax(logits, 1),
                           per_example_loss=tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                                         logits=logits))

    def input_fn(ctx):
        ds = ctx.shard(tf.data.Dataset.from_tensor_slices((x, y))).repeat()
        return ds.batch(ctx.per_replica_batch, drop_remainder=True)

    result = fit(model_fn, input_fn, optimizer=lambda: tf1.train.GradientDescentOptimizer(0.01),
                 strategy=ParameterServerStrategy(cfg["mode"]), steps=cfg["steps"], batch_size=cfg["batch"],
                 log_every_secs=5.0, checkpoint_dir=None)
    with open(cfg["out"], "w", encoding="utf-8") as f:
        json.dump(result.__dict__, f)


# --------------------------------------------------------------- the driver
def child_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", GRPC_VERBOSITY="NONE", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def rate_in(timeline, t0, t1):
    """Steps per second of a (time, steps) timeline between t0 and t1, by linear interpolation."""
    def steps_at(t):
        for (ta, sa), (tb, sb) in zip(timeline, timeline[1:]):
            if ta <= t <= tb:
                return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else sb
        return timeline[0][1] if t < timeline[0][0] else timeline[-1][1]
    return (steps_at(t1) - steps_at(t0)) / (t1 - t0) if t1 > t0 else float("nan")


def run_mode(mode, steps, batch, tmp, timeout):
    from tfcluster.ports import pick_free_ports
    p = pick_free_ports(3)
    cluster = {"worker": [f"localhost:{p[0]}", f"localhost:{p[1]}"], "ps": [f"localhost:{p[2]}"]}
    cluster_file = os.path.join(tmp, f"{mode}-cluster.json")
    with open(cluster_file, "w", encoding="utf-8") as f:
        json.dump(cluster, f)
    procs, launched, outs = [], {}, {}
    logs = []
    try:
        log = open(os.path.join(tmp, f"{mode}-ps.log"), "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "tfcluster", "start", "--cluster", cluster_file,
                                       "--job", "ps", "--task", "0"], env=child_env(), stdout=log, stderr=log,
                                      start_new_session=True))
        for i in range(2):
            outs[i] = os.path.join(tmp, f"{mode}-worker{i}.json")
            cfg = os.path.join(tmp, f"{mode}-worker{i}-cfg.json")
            with open(cfg, "w", encoding="utf-8") as f:
                json.dump({"mode": mode, "steps": steps, "batch": batch, "out": outs[i]}, f)
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            log = open(os.path.join(tmp, f"{mode}-worker{i}.log"), "w")
            logs.append(log)
            launched[i] = time.time()
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", cfg],
                                          env=child_env(TF_CONFIG=tf_config), stdout=log, stderr=log,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        for log in logs:
            log.close()
    results = {}
    for i in range(2):
        if procs[i + 1].returncode != 0:
            raise SystemExit(f"{mode} worker {i} failed (exit {procs[i + 1].returncode}); see {tmp}")
        with open(outs[i], encoding="utf-8") as f:
            results[i] = json.load(f)
    t0 = max(r["first_step_at"] for r in results.values())
    t1 = min(r["last_step_at"] for r in results.values())
    rows = []
    for i, r in results.items():
        both = rate_in(r["timeline"], t0, t1) * batch
        rows.append(dict(mode=mode, worker=i, launch_to_first_step=r["first_step_at"] - launched[i],
                         examples_per_sec_both_running=both, examples_per_sec_whole_loop=r["examples_per_sec"],
                         local_steps=r["local_steps"], global_step=r["global_step"], window=t1 - t0))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", metavar="CFG", help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="sync,async", help="comma-separated: sync, async (default both)")
    ap.add_argument("--steps", type=int, default=None,
                    help="global steps per run (default: 1500 sync, 3000 async, i.e. ~1500 local steps each)")
    ap.add_argument("--batch", type=int, default=128, help="per-worker batch (default 128)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per run (default 900)")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    rows = []
    with tempfile.TemporaryDirectory(prefix="train_speed-") as tmp:
        for mode in a.modes.split(","):
            steps = a.steps or (1500 if mode == "sync" else 3000)
            rows += run_mode(mode, steps, a.batch, tmp, a.timeout)
    print(f"MLP 784-512-10, batch {a.batch} per worker, 1 ps + 2 workers, {os.cpu_count()} CPU(s)")
    print(f"{'mode':<6} {'worker':>6} {'launch->1st step':>17} {'ex/s (both running)':>20} "
          f"{'ex/s (whole loop)':>18} {'local steps':>12} {'window':>8}")
    for r in rows:
        print(f"{r['mode']:<6} {r['worker']:>6} {r['launch_to_first_step']:>16.1f}s "
              f"{r['examples_per_sec_both_running']:>20.0f} {r['examples_per_sec_whole_loop']:>18.0f} "
              f"{r['local_steps']:>12} {r['window']:>7.1f}s")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
