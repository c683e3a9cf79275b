#!/usr/bin/env python3
"""Throughput of every tfcluster strategy on one model, interleaved in one run, with medians.

    python scripts/strategy_speed.py                       # all strategies, 3 rounds
    python scripts/strategy_speed.py --rounds 5 --strategies local,mirrored2,collective

The model is the bench workload (scripts/bench/common.py): an MLP 784-512-10
on in-memory random data fed through tf.data, plain SGD, batch 128 *per
replica* (a tower or a worker), trained through ``tfcluster.fit``. Each run
is a fresh process (or cluster of processes, started by hand with TF_CONFIG:
the ps with ``tfcluster start``); every round runs every strategy once, in an
order that rotates from round to round, so that a machine busy with other work
slows every strategy alike. A strategy's figure is the median over the rounds
(min-max beside it).

examples/s of a run = the sum over its workers of (steps/s x batch x towers),
each worker's steps/s taken from its step timeline over the window in which
every worker was stepping (after every first step, before any last one), so
start-up and a late or early peer do not count.

Copies: every collective run all-gathers a checksum of every variable of every
worker when it ends and fails if any differs; the table says whether that check
ran and passed. (The tests compare full dumps bit for bit, and every strategy's
weights against one device training on the global batch.)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(HERE, "bench"))

#: name -> (ps tasks, workers, towers per worker, what it is)
STRATEGIES = {
    "local": (0, 1, 1, "one process, one device"),
    "mirrored2": (0, 1, 2, "mirrored, 2 virtual CPU devices"),
    "central2": (0, 1, 2, "central storage, 2 virtual CPU devices"),
    "collective": (0, 2, 1, "collective all-reduce, 2 workers"),
    "collective-towers2": (0, 2, 2, "collective, 2 workers x 2 towers"),
    "ps-async": (1, 2, 1, "async ps, 1 ps + 2 workers"),
    "ps-sync": (1, 2, 1, "sync ps, 1 ps + 2 workers"),
    "ps-sync-towers2": (1, 2, 2, "sync ps, 2 workers x 2 towers"),
}


# ------------------------------------------------------------------ a worker
def make_strategy(name):
    from tfcluster.strategies import (CentralStorageStrategy, CollectiveAllReduceStrategy, LocalStrategy,
                                      MirroredStrategy, ParameterServerStrategy)
    return {
        "local": LocalStrategy,
        "mirrored2": lambda: MirroredStrategy(2),
        "central2": lambda: CentralStorageStrategy(2),
        "collective": CollectiveAllReduceStrategy,
        "collective-towers2": lambda: CollectiveAllReduceStrategy(devices=2),
        "ps-async": lambda: ParameterServerStrategy("async"),
        "ps-sync": lambda: ParameterServerStrategy("sync"),
        "ps-sync-towers2": lambda: ParameterServerStrategy("sync").with_towers(2),
    }[name]()


def worker(cfg_path):
    """Train as TF_CONFIG's task (or alone) and write fit's result as JSON."""
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    import tfcluster
    tfcluster.quiet_tensorflow()
    import tensorflow as tf
    from common import mlp_logits, synthetic
    from tfcluster.cli import setup_logging
    from tfcluster.strategies import ModelOutput
    from tfcluster.train import fit
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    setup_logging()
    x, y = synthetic()

    def model_fn(features, labels, mode):
        logits = mlp_logits(tf1, features)
        return ModelOutput(predictions=tf.argmax(logits, 1),
                           per_example_loss=tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                                         logits=logits))

    def input_fn(ctx):
        ds = ctx.shard(tf.data.Dataset.from_tensor_slices((x, y))).repeat()
        return ds.batch(ctx.per_replica_batch, drop_remainder=True)

    result = fit(model_fn, input_fn, optimizer=lambda: tf1.train.GradientDescentOptimizer(0.01),
                 strategy=make_strategy(cfg["strategy"]), steps=cfg["steps"], batch_size=cfg["batch"],
                 log_every_secs=1e9, checkpoint_dir=None)
    if result is not None:
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


def run(name, steps, batch, tmp, timeout, round_no):
    """One run of strategy ``name``: its processes, then (examples/s, copies checked, window seconds)."""
    from tfcluster.ports import pick_free_ports
    ps, workers, towers, _ = STRATEGIES[name]
    tag = f"{name}-r{round_no}"
    ports = pick_free_ports(ps + workers)
    cluster = {"worker": [f"localhost:{p}" for p in ports[:workers]]}
    if ps:
        cluster["ps"] = [f"localhost:{p}" for p in ports[workers:]]
    procs, outs, logs = [], [], []
    try:
        if ps:
            cluster_file = os.path.join(tmp, f"{tag}-cluster.json")
            with open(cluster_file, "w", encoding="utf-8") as f:
                json.dump(cluster, f)
            log = open(os.path.join(tmp, f"{tag}-ps.log"), "w")
            logs.append(log.name)
            procs.append(subprocess.Popen([sys.executable, "-m", "tfcluster", "start", "--cluster", cluster_file,
                                           "--job", "ps", "--task", "0"], env=child_env(), stdout=log,
                                          stderr=log, start_new_session=True))
            log.close()
        for i in range(workers):
            out = os.path.join(tmp, f"{tag}-worker{i}.json")
            cfg = os.path.join(tmp, f"{tag}-worker{i}-cfg.json")
            with open(cfg, "w", encoding="utf-8") as f:
                json.dump({"strategy": name, "steps": steps, "batch": batch, "out": out}, f)
            env = child_env()
            if workers > 1 or ps:
                env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            log = open(os.path.join(tmp, f"{tag}-worker{i}.log"), "w")
            logs.append(log.name)
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", cfg], env=env, stdout=log,
                                          stderr=log, start_new_session=True))
            log.close()
            outs.append(out)
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    teardown = []
    for proc, log in zip(procs, logs):
        if proc.returncode != 0:
            with open(log, encoding="utf-8", errors="replace") as f:
                text = f.read()
            task = os.path.basename(log)[len(tag) + 1:-4]
            out = os.path.join(tmp, f"{tag}-{task}.json")
            # A worker that wrote its result and then crashed while the interpreter shut down
            # trained fully; its figures count, and the crash is reported.
            if task.startswith("worker") and os.path.exists(out) and " done: global step" in text:
                last = text.strip().splitlines()[-1]
                teardown.append(f"{tag} {task}: exit {proc.returncode} after training ({last})")
                continue
            raise SystemExit(f"{tag}: {task} failed (exit {proc.returncode}); its log ends:\n{text[-3000:]}")
    results = []
    for out in outs:
        with open(out, encoding="utf-8") as f:
            results.append(json.load(f))
    t0 = max(r["first_step_at"] for r in results)
    t1 = min(r["last_step_at"] for r in results)
    eps = sum(rate_in(r["timeline"], t0, t1) for r in results) * batch * towers
    checked = None
    if name.startswith("collective"):
        texts = [open(log, encoding="utf-8", errors="replace").read() for log in logs]
        checked = all(f"all {workers} workers hold identical variables" in t for t in texts)
    return eps, checked, t1 - t0, teardown


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", metavar="CFG", help=argparse.SUPPRESS)
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help=f"comma-separated, from: {', '.join(STRATEGIES)} (default: all)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each strategy, interleaved (default 3)")
    ap.add_argument("--steps", type=int, default=400,
                    help="training steps per worker per run (default 400; async runs 2x the global steps)")
    ap.add_argument("--batch", type=int, default=128, help="per-replica batch (default 128)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds allowed per run (default 600)")
    ap.add_argument("--json", metavar="FILE", help="also write every run's figures to FILE")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker)
    names = [n.strip() for n in a.strategies.split(",") if n.strip()]
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        ap.error(f"unknown strateg{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                 f"use {', '.join(STRATEGIES)}")
    if a.rounds < 1 or a.steps < 10:
        ap.error("--rounds must be >= 1 and --steps >= 10")
    runs = {n: [] for n in names}
    teardown = []
    with tempfile.TemporaryDirectory(prefix="strategy_speed-") as tmp:
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                # Async counts every worker's update in the global step.
                steps = a.steps * STRATEGIES[name][1] if name == "ps-async" else a.steps
                eps, checked, window, crashes = run(name, steps, a.batch, tmp, a.timeout, r)
                teardown += crashes
                runs[name].append({"examples_per_sec": eps, "copies_identical": checked, "window": window})
                print(f"round {r + 1}/{a.rounds} {name:<20} {eps:8.0f} examples/s  (window {window:.1f}s)",
                      flush=True)
    print(f"\nMLP 784-512-10, batch {a.batch} per replica, plain SGD, {a.steps} steps per worker, "
          f"{a.rounds} interleaved round(s), {os.cpu_count()} CPU(s)")
    print(f"{'strategy':<20} {'layout':<38} {'replicas':>8} {'median ex/s':>12} {'min-max':>15} {'copies':>9}")
    for name in names:
        ps, workers, towers, what = STRATEGIES[name]
        eps = [x["examples_per_sec"] for x in runs[name]]
        checks = [x["copies_identical"] for x in runs[name]]
        copies = "-" if checks[0] is None else ("identical" if all(checks) else "DIFFER")
        print(f"{name:<20} {what:<38} {workers * towers:>8} {statistics.median(eps):>12.0f} "
              f"{min(eps):>7.0f}-{max(eps):<7.0f} {copies:>9}")
    for line in teardown:
        print(f"note: {line}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"batch": a.batch, "steps": a.steps, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
