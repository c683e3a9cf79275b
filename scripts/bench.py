#!/usr/bin/env python3
"""Benchmarks: tfcluster against hand-written TF1, TF2 ParameterServerStrategy and one process.

    python scripts/bench.py            # full figures (about 30-40 minutes on 2 cores)
    python scripts/bench.py --quick    # a smoke run for CI (under 2 minutes)
    python scripts/bench.py --rows tfcluster_sync,tfcluster_async --reps 5   # some rows only
    python scripts/bench.py --reps 3 --steps 1500 --out docs/bench --readme --profile   # the README's table

Every figure compares A with B interleaved in one run (the order rotates each
repeat), and reports the median with its min-max spread. Results go to
``--out`` (default ``bench-results/``): results.json, results.md and, when
matplotlib is installed (``pip install -e '.[bench]'``), ratios.png and
throughput.png (``--replot`` draws them again from results.json). ``--readme``
rewrites the README's table (between its ``bench:begin`` and ``bench:end``
marks) from this run; ``--profile`` adds
where a ps step's time goes (scripts/bench/profile_step.py) to results.md.

Workloads (scripts/bench/): an MLP 784-512-10 with batch 128 per worker (per
tower, in the tower rows), a bigger MLP 784-2048-2048-10 (5.8M parameters)
with batch 64 per worker, both on in-memory data, and the tutorials' CNN; on
1 ps + 2 workers unless a row says otherwise. The click-through rows (``ctr_*``,
``--rows 'ctr_*'`` alone) train examples/click_through_fit.py's wide & deep on
2 ps + 2 workers, batch 512 per worker, against the same model by hand in raw
TF1 and on TF2 ParameterServerStrategy (docs/embeddings.md). Cluster throughput is measured
over the window in which every worker was stepping, from each worker's step
timeline, so a worker that starts late (raw TF1's non-chief waits 30 s for
the model) does not distort it. The TF2 mode rows (``tf2_*``) train the TF 2
tutorials' CNN as ``fit`` and as a custom loop (scripts/bench/tf2_cnn.py) on 2
workers under ``tfcluster local --tf2``, against TF's MultiWorkerMirroredStrategy
set up by hand on the same global batch, and in one process with and without
the mode. Every row runs with tfcluster's default math (``--math auto``:
bfloat16 where the CPU has it, graph/precision.py); the ``*_f32`` rows pin
float32 for the bigger MLP, the CNN and the click-through step, and
``digits_math`` measures the README example's accuracy in both.
"""

import argparse
import datetime
import fnmatch
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BENCH = os.path.join(HERE, "bench")
sys.path.insert(0, REPO)
sys.path.insert(0, BENCH)

from figures import figures  # noqa: E402
from runs import PY, child_env, parse_bench, run_by_hand, run_hosts, run_local, run_single, run_tf2_pss  # noqa: E402
from startup import IMPORTS, import_cost, tcp_loopback_bps, tf1_run_cost, tf_import_seconds  # noqa: E402
#: The click-through rows' TFRecord shards: made by the first row that reads them, removed when the bench ends.
CLICKS = os.path.join(tempfile.gettempdir(), f"tfcbench-clicks-{os.getpid()}")


def digits_accuracy(mode, wire, math="auto"):
    """The README example's test accuracy after training on 1 ps + 2 workers with this wire and math."""
    ckpt = tempfile.mkdtemp(prefix="tfcbench-digits-")
    try:
        p = subprocess.run([PY, "-m", "tfcluster", "local", "--ps", "1", "--workers", "2", "--wire", wire,
                            "--math", math, "--log-dir", os.path.join(ckpt, "logs"), "--", PY, os.path.join(REPO, "examples",
                                                                                            "digits.py"),
                            "--mode", mode, "--checkpoint-dir", os.path.join(ckpt, "run")],
                           capture_output=True, text=True, timeout=300, env=child_env())
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    for line in p.stdout.splitlines():
        if "test accuracy " in line:
            return float(line.split("test accuracy ", 1)[1].split()[0])
    return None


def one_run(workload: str, ps: int, timeout: int):
    """The BENCH line of ``scripts/bench/<workload>.py`` run once as the one trainer beside ``ps`` ps tasks, or
    None when the run failed (said in one line)."""
    try:
        run = run_local([os.path.join(BENCH, f"{workload}.py")], ps=ps, workers=1, timeout=timeout)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"bench: {workload} failed: {str(e).splitlines()[0]}", flush=True)
        return None
    return run["results"][0]


def save_seconds():
    """A full save of 2 ps' state, sharded and unsharded alternately, then an embedding variable's full and
    incremental saves (scripts/bench/saves.py): seconds, bytes and restore seconds."""
    return one_run("saves", ps=2, timeout=600)


def drift_memory():
    """A ps's memory on a drifting id stream with eviction (scripts/bench/drift.py): resident memory and rows at
    steady state and after ten times its ids."""
    return one_run("drift", ps=1, timeout=900)


#: Rows beside the click-through ones whose run writes the README's second table (``--rows 'ctr_*,...'``): the
#: bigger MLP and the CNN in both maths, the issue's figures of bfloat16 math with those of the click-through step.
SECOND_TABLE = ("big_single", "big_single_f32", "big_async", "big_async_f32", "single_cnn", "single_cnn_f32",
                "tfcluster_async_cnn", "tfcluster_async_cnn_f32")

#: Measurements that are not rows of examples/s, by the name ``--rows`` selects them with.
MEASURES = {"pull": "pulling a 64 MB variable from a ps", "saves": "a full save of 2 ps' state, sharded or not",
            "drift": "a ps's memory on an id stream that keeps bringing new ids, with eviction",
            "digits_math": "the README example's test accuracy with bfloat16 and with float32 math"}


# ------------------------------------------------------------------ the rows
def rows(quick, steps):
    """``{row: (workload, system, how to run it once)}`` of this mode, in the order of the first repeat."""
    fit = os.path.join(BENCH, "tfcluster_fit.py")
    raw = os.path.join(BENCH, "raw_tf1.py")
    big = steps // 10

    def mlp(mode, n=steps, *more):
        return [fit, "--mode", mode, "--steps", str(n), *more]
    bf16 = ["--wire", "bfloat16"]
    out = {
        "tfcluster_async": ("mlp", "tfcluster", lambda: run_local(mlp("async"))),
        "raw_tf1_async": ("mlp", "raw TF1", lambda: run_local([raw, "--steps", str(steps)], extra=["--legacy-flags"])),
        "single_b128": ("mlp", "one process", lambda: run_single(mlp("local"))),
        "tfcluster_async_bf16": ("mlp", "tfcluster", lambda: run_local(mlp("async"), extra=bf16)),
    }
    if quick:
        return out
    out.update({
        "tfcluster_async_tf_threads": ("mlp", "tfcluster",
                                       lambda: run_local(mlp("async"), extra=["--threads-per-task", "0"])),
        "tfcluster_async_autotune": ("mlp", "tfcluster", lambda: run_local(mlp("async", steps, "--autotune"))),
        "tfcluster_sync": ("mlp", "tfcluster", lambda: run_local(mlp("sync"))),
        "tfcluster_sync_bf16": ("mlp", "tfcluster", lambda: run_local(mlp("sync"), extra=bf16)),
        "tf2_pss": ("mlp", "TF2 PSS", lambda: run_tf2_pss(steps)),
        "tfcluster_async_1w": ("mlp", "tfcluster", lambda: run_local(mlp("async", steps // 2), workers=1)),
        "single_b256": ("mlp", "one process", lambda: run_single(mlp("local", steps // 2, "--batch", "256"))),
        "big_async": ("big", "tfcluster", lambda: run_local(mlp("async", big, "--model", "big"))),
        "big_async_bf16": ("big", "tfcluster", lambda: run_local(mlp("async", big, "--model", "big"), extra=bf16)),
        "big_sync": ("big", "tfcluster", lambda: run_local(mlp("sync", big, "--model", "big"))),
        "big_sync_bf16": ("big", "tfcluster", lambda: run_local(mlp("sync", big, "--model", "big"), extra=bf16)),
        "big_single": ("big", "one process", lambda: run_single(mlp("local", big, "--model", "big"))),
        "tfcluster_async_cnn": ("cnn", "tfcluster", lambda: run_local(mlp("async", steps // 3, "--model", "cnn"))),
        "single_cnn": ("cnn", "one process", lambda: run_single(mlp("local", steps // 3, "--model", "cnn"))),
        "mirrored_2": ("mlp", "one process", lambda: run_single(mlp("mirrored", steps // 2, "--devices", "2"))),
        "mirrored_4": ("mlp", "one process", lambda: run_single(mlp("mirrored", steps // 4, "--devices", "4"))),
        "central_2": ("mlp", "one process", lambda: run_single(mlp("central", steps // 2, "--devices", "2"))),
        "collective_2w": ("mlp", "tfcluster", lambda: run_local(mlp("collective"), ps=0)),
        "collective_2w_bf16": ("mlp", "tfcluster", lambda: run_local(mlp("collective"), ps=0, extra=bf16)),
        "collective_2w_towers_2": ("mlp", "tfcluster",
                                   lambda: run_local(mlp("collective", steps // 2, "--devices", "2"), ps=0)),
        "tfcluster_sync_towers_2": ("mlp", "tfcluster", lambda: run_local(mlp("sync", steps // 2, "--devices", "2"))),
    })
    out.update(math_rows(steps))
    out.update(ctr_rows(steps // 2))
    out.update(tf2_rows(steps // 10))
    out.update(horovod_rows(steps // 3))
    return out


def math_rows(steps):
    """The float32 twins of the bigger MLP's and the CNN's rows (graph/precision.py): every other row runs with
    the default math, bfloat16 where the CPU has it; these pin float32, in one process and on 1 ps + 2 workers."""
    fit = os.path.join(BENCH, "tfcluster_fit.py")
    f32 = dict(TFCLUSTER_MATH="float32")

    def job(mode, model, n):
        return [fit, "--mode", mode, "--steps", str(n), "--model", model]
    return {
        "big_single_f32": ("big", "one process", lambda: run_single(job("local", "big", steps // 10), **f32)),
        "big_async_f32": ("big", "tfcluster", lambda: run_local(job("async", "big", steps // 10),
                                                                extra=["--math", "float32"])),
        "single_cnn_f32": ("cnn", "one process", lambda: run_single(job("local", "cnn", steps // 3), **f32)),
        "tfcluster_async_cnn_f32": ("cnn", "tfcluster", lambda: run_local(job("async", "cnn", steps // 3),
                                                                          extra=["--math", "float32"])),
    }


def horovod_rows(steps):
    """Horovod's rows (docs/horovod.md): a Horovod TF 1.x program (scripts/bench/horovod_cnn.py, the digits CNN,
    batch 128 per rank) in TF1 mode on 2 workers, with and without fp16 compression, and in one process; the same
    CNN through tfcluster.fit's collective strategy on 2 workers."""
    hvd = os.path.join(BENCH, "horovod_cnn.py")
    fit = [os.path.join(BENCH, "tfcluster_fit.py"), "--mode", "collective", "--model", "cnn", "--steps", str(steps)]
    job = [hvd, "--steps", str(steps)]
    return {
        "hvd_cnn": ("hvd", "tfcluster", lambda: run_local(job, ps=0, extra=["--tf1"])),
        "hvd_cnn_fp16": ("hvd", "tfcluster", lambda: run_local([*job, "--fp16"], ps=0, extra=["--tf1"])),
        "hvd_cnn_collective": ("hvd", "tfcluster", lambda: run_local(fit, ps=0)),
        "hvd_cnn_single": ("hvd", "one process", lambda: run_single(["-m", "tfcluster.tf1", *job])),
    }


def tf2_rows(steps):
    """TF2 mode's rows (docs/tf2.md): the tutorials' CNN as ``fit`` and as a custom loop, global batch 128, on 2
    workers under ``tfcluster local --tf2`` and by hand on TF's MultiWorkerMirroredStrategy, and in one process
    with and without the mode."""
    cnn = os.path.join(BENCH, "tf2_cnn.py")
    keras2 = dict(TF_USE_LEGACY_KERAS="1")     # plain TF runs a TF 2.15 program's Keras 2 as TF2 mode does: tf-keras
    out = {}
    for loop in ("fit", "custom"):
        def job(strategy, loop=loop):
            return [cnn, "--loop", loop, "--strategy", strategy, "--steps", str(steps)]
        out.update({
            f"tf2_{loop}_tfcluster": ("tf2", "tfcluster", lambda job=job: run_local(job("mirrored"), ps=0,
                                                                                   extra=["--tf2"])),
            f"tf2_{loop}_by_hand": ("tf2", "plain TF", lambda job=job: run_by_hand(job("multi_worker"), **keras2)),
            f"tf2_{loop}_single": ("tf2", "one process", lambda job=job: run_single(job("mirrored"), **keras2)),
            f"tf2_{loop}_single_mode": ("tf2", "tfcluster",
                                        lambda job=job: run_single(["-m", "tfcluster.tf2", *job("mirrored")])),
        })
    return out


def ctr_rows(steps):
    """The click-through rows (docs/embeddings.md): wide & deep over 26 hashed columns, batch 512 per worker,
    2 workers, 2 ps unless a row says otherwise; ``H`` hash buckets per column (100,000 unless named)."""
    data = CLICKS
    ctr, raw = os.path.join(BENCH, "ctr.py"), os.path.join(BENCH, "ctr_raw_tf1.py")

    def fit(mode, buckets=100_000, *more):
        return [ctr, "--mode", mode, "--buckets", str(buckets), "--steps", str(steps), "--data-dir", data, *more]

    def local(workload, ps=2, extra=(), memory=False):
        return lambda: run_local(workload, ps=ps, extra=extra, memory=memory, timeout=900)

    def stream(*model, extra=()):
        """A drifting click stream read once (scripts/clicklog.py --drift), saves every 50 steps into a fresh
        directory, the held-out AUC in the BENCH line. Adagrad's initial accumulator is 0.001, not TF's 0.1:
        with 0.1 a row's step is ~1/300 of its gradient's sign at batch 512, no model learns any id past the
        head, and the AUC is the numeric features' alone (0.78 on a 300-step run, whatever the tables)."""
        def run():
            checkpoints = tempfile.mkdtemp(prefix="tfcbench-stream-")
            try:
                return run_local(fit("async", *model, "--drift", "0.5", "--examples", str(steps * 512),
                                     "--accumulator", "0.001", "--save-steps", "50", "--checkpoint-dir",
                                     checkpoints), ps=2, extra=extra, memory=True, timeout=900)
            finally:
                shutil.rmtree(checkpoints, ignore_errors=True)
        return run
    # The traced rows place dense variables as ps on two machines would (split over both: C7 is their traffic).
    bf16, traced = ["--wire", "bfloat16"], ["--trace", "5", "--after", "20", "--split-kb", "256"]
    f32 = ["--math", "float32"]
    return {
        "ctr_async": ("ctr", "tfcluster", local(fit("async"), memory=True)),
        "ctr_async_f32": ("ctr", "tfcluster", local(fit("async"), extra=f32)),
        "ctr_async_noprefetch": ("ctr", "tfcluster", local(fit("async", 100_000, "--no-prefetch"))),
        "ctr_async_1ps": ("ctr", "tfcluster", local(fit("async"), ps=1, memory=True)),
        # Each task on a host of its own, links of 200 Mbit/s (root: network namespaces): where the wire binds, as
        # between machines, and 1 ps serves both workers' rows (B2 across links).
        "ctr_links": ("ctr", "tfcluster", lambda: run_hosts(fit("async"), ps=1, timeout=900)),
        "ctr_links_noprefetch": ("ctr", "tfcluster", lambda: run_hosts(fit("async", 100_000, "--no-prefetch"), ps=1,
                                                                        timeout=900)),
        "ctr_async_ev": ("ctr", "tfcluster", local(fit("async", 100_000, "--embedding-variables"), memory=True)),
        # Fixed tables of the memory the embedding variables take on the stream (H = 50,000: 0.95-1.1 of their ps
        # peak in 1,000-step runs, 2026-11-30; every run reports both peaks, E1 their ratio).
        "ctr_stream": ("ctr", "tfcluster", stream(50_000)),
        "ctr_stream_ev": ("ctr", "tfcluster", stream(50_000, "--embedding-variables", "--filter-freq", "2",
                                                     "--steps-to-live", "100")),
        # The held-out AUC with float32 math, and without the next step's rows fetched during this one.
        "ctr_stream_f32": ("ctr", "tfcluster", stream(50_000, extra=f32)),
        "ctr_stream_noprefetch": ("ctr", "tfcluster", stream(50_000, "--no-prefetch")),
        "ctr_sync": ("ctr", "tfcluster", local(fit("sync"))),
        "ctr_raw_tf1": ("ctr", "raw TF1", local([raw, "--steps", str(steps), "--data_dir", data],
                                                extra=["--legacy-flags"])),
        # The same program under TF1 mode: what tfcluster gives a program by hand without changing it.
        "ctr_raw_tf1_mode": ("ctr", "tfcluster", local([raw, "--steps", str(steps), "--data_dir", data],
                                                       extra=["--legacy-flags", "--tf1"])),
        "ctr_tf2_pss": ("ctr", "TF2 PSS", lambda: run_tf2_pss(steps, script="ctr_tf2_pss.py", ps=2,
                                                              BENCH_DATA_DIR=data, timeout=900)),
        "ctr_async_h10k": ("ctr", "tfcluster", local(fit("async", 10_000))),
        "ctr_async_h1m": ("ctr", "tfcluster", local(fit("async", 1_000_000))),
        "ctr_sync_h1m": ("ctr", "tfcluster", local(fit("sync", 1_000_000))),
        "ctr_async_bf16": ("ctr", "tfcluster", local(fit("async"), extra=bf16)),
        "ctr_traffic": ("ctr", "tfcluster", local(fit("async", 100_000, *traced))),
        "ctr_traffic_bf16": ("ctr", "tfcluster", local(fit("async", 100_000, *traced), extra=bf16)),
        # A table per column (52 variables, as feature columns make them) against one of every column.
        "ctr_async_columns": ("ctr", "tfcluster", local(fit("async", 100_000, "--table-per-column"))),
        "ctr_traffic_columns": ("ctr", "tfcluster", local(fit("async", 100_000, "--table-per-column", *traced))),
        # 52 tables on a bfloat16 wire: each pack of their rows and gradients cast once, not once a table.
        "ctr_async_columns_bf16": ("ctr", "tfcluster", local(fit("async", 100_000, "--table-per-column"),
                                                             extra=bf16)),
    }


def cluster_throughput(run):
    """Examples/s of the whole cluster over the window in which every worker stepped (None: the run failed)."""
    if run is None:
        return None
    rs = run["results"]
    # One total, no timelines, or a worker that never stepped (the others reached the step target before it
    # started): no common window, each worker's own rate.
    if len(rs) == 1 and rs[0].get("cluster_total") or "timeline" not in rs[0] \
            or any(r["first_step_at"] is None for r in rs):
        return sum(r["examples_per_sec"] for r in rs)
    start = max(r["first_step_at"] for r in rs)
    end = min(r["last_step_at"] for r in rs)
    if end - start < 1.0:  # no real overlap: fall back to each worker's own rate
        return sum(r["examples_per_sec"] for r in rs)
    examples = sum((_steps_at(r["timeline"], end) - _steps_at(r["timeline"], start)) * r["batch"] for r in rs)
    return examples / (end - start)


def _steps_at(timeline, t):
    pts = sorted(timeline)
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, s0), (t1, s1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return s0 + (s1 - s0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return pts[-1][1]


# -------------------------------------------------------------------- driver
def measure(quick, steps=None, reps=None, only=None, accuracy=True):
    """Run every row ``reps`` times, interleaved; ``(runs, extra measurements, meta)``."""
    steps = steps or (200 if quick else 3000)
    reps = reps or (1 if quick else 3)
    configs = rows(quick, steps)
    if only is not None:
        unknown = sorted(p for p in only if not fnmatch.filter(list(configs) + list(MEASURES), p))
        if unknown:
            raise SystemExit(f"bench: no row {', '.join(unknown)} in {'quick' if quick else 'full'} mode; "
                             f"rows: {', '.join(list(configs) + list(MEASURES))}")
        only = [k for k in list(configs) + list(MEASURES) if any(fnmatch.fnmatch(k, p) for p in only)]
        configs = {k: v for k, v in configs.items() if k in only}
    runs = {name: [] for name in configs}
    names = list(configs)
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)] if names else []
        for name in order:
            t = time.time()
            try:
                run = configs[name][2]()
                rate = cluster_throughput(run)
            except Exception as e:  # a broken row is reported, not fatal to the others
                runs[name].append(None)  # one entry a repeat: every row's repeats stay aligned for the paired ratios
                print(f"bench: {name} rep {rep + 1} failed: {str(e).splitlines()[0]}", flush=True)
                continue
            runs[name].append(run)
            print(f"bench: {name} rep {rep + 1}/{reps}: {rate:.0f} examples/s ({time.time() - t:.0f}s)", flush=True)
    extra = dict(pull=[], pull_whole=[], tcp=[], tf_import=[], accuracy={}, saves=[], drift=[],
                 digits_math={"bfloat16": [], "float32": []},
                 import_cpu={kind: [] for kind in IMPORTS}, import_rss={kind: [] for kind in IMPORTS},
                 tf1_cpu={"fork": [], "no_fork": []}, tf1_wall={"fork": [], "no_fork": []})
    pull_mb = 16 if quick else 64
    for rep in range(reps):
        extra["tf_import"].append(tf_import_seconds())
        for kind in sorted(IMPORTS, reverse=rep % 2 == 1):      # side by side, the order alternating
            cpu, rss = import_cost(kind)
            extra["import_cpu"][kind].append(cpu)
            extra["import_rss"][kind].append(rss)
        for fork in (True, False) if rep % 2 == 0 else (False, True):
            wall, cpu = tf1_run_cost(fork)
            extra["tf1_wall"]["fork" if fork else "no_fork"].append(wall)
            extra["tf1_cpu"]["fork" if fork else "no_fork"].append(cpu)
        if not quick and (only is None or "saves" in only):
            extra["saves"].append(save_seconds())
            print(f"bench: saves rep {rep + 1}/{reps}: {extra['saves'][-1]}", flush=True)
        if not quick and (only is None or "drift" in only):
            extra["drift"].append(drift_memory())
            print(f"bench: drift rep {rep + 1}/{reps}: {extra['drift'][-1]}", flush=True)
        if not quick and (only is None or "digits_math" in only):
            for math in ("auto", "float32") if rep % 2 == 0 else ("float32", "auto"):
                got = digits_accuracy("sync", "float32", math)
                extra["digits_math"]["float32" if math == "float32" else "bfloat16"].append(got)
                print(f"bench: digits sync, {math} math, rep {rep + 1}/{reps}: test accuracy {got}", flush=True)
        if only is not None and "pull" not in only:
            continue
        extra["tcp"].append(tcp_loopback_bps(pull_mb, 2.0 if quick else 4.0))
        pull = subprocess.run([PY, "-m", "tfcluster", "local", "--ps", "1", "--workers", "1", "--", PY,
                               os.path.join(BENCH, "pull.py")], capture_output=True, text=True, timeout=300,
                              env=child_env(BENCH_PULL_MB=pull_mb, BENCH_SECONDS=2 if quick else 5))
        r = parse_bench(pull.stdout)
        extra["pull"].append(r[0]["bytes_per_sec"] if r else None)
        extra["pull_whole"].append(r[0]["whole_bytes_per_sec"] if r else None)
    if accuracy and not quick and only is None:
        for mode in ("sync", "async"):
            for wire in ("float32", "bfloat16"):
                extra["accuracy"][f"{mode}_{wire}"] = digits_accuracy(mode, wire)
                print(f"bench: digits {mode} {wire} wire: test accuracy {extra['accuracy'][f'{mode}_{wire}']}",
                      flush=True)
    meta = dict(steps=steps, reps=reps, workloads={k: v[0] for k, v in configs.items()},
                systems={k: v[1] for k, v in configs.items()})
    return runs, extra, meta


def profiles(quick):
    """Where a step's time goes: scripts/bench/profile_step.py on 1 ps + 2 workers, as ``{case: [PROFILE]}``."""
    cases = [("async", "mlp", "float32")] if quick else [
        (m, model, w) for model in ("mlp", "big") for m in ("async", "sync") for w in ("float32", "bfloat16")]
    out = {}
    for mode, model, wire in cases:
        p = subprocess.run([PY, "-m", "tfcluster", "local", "--ps", "1", "--workers", "2", "--wire", wire, "--",
                            PY, os.path.join(BENCH, "profile_step.py"), "--mode", mode, "--model", model]
                           + (["--warmup", "5", "--traced", "3"] if quick else []),
                           capture_output=True, text=True, timeout=600, env=child_env())
        case = f"{mode} {model} {wire}"
        out[case] = parse_bench(p.stdout, "PROFILE ")
        steps = ", ".join(f"{d['task']} {d['step_ms']:.1f} ms" for d in out[case]) or f"failed (exit {p.returncode})"
        print(f"bench: profiled {case}: {steps}", flush=True)
    return out


def machine() -> str:
    """The machine in one line, with the CPU's bfloat16 flags: the bfloat16 rows' ratios depend on them (AMX
    multiplies bfloat16 tiles; AVX512-BF16 alone about doubles the float32 rate)."""
    from tfcluster.graph.precision import BF16_FLAGS, cpu_flags
    flags = [f for f in BF16_FLAGS if f in cpu_flags()]
    return (f"{platform.machine()}, {os.cpu_count()} cores ({', '.join(flags) or 'no bfloat16 flags'}), "
            f"Python {platform.python_version()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one short repeat of the core rows (CI smoke run)")
    p.add_argument("--out", default="bench-results", help="directory for results.json/.md and the plots")
    p.add_argument("--reps", type=int, help="repeats of every row (default 3; 1 with --quick)")
    p.add_argument("--steps", type=int, help="global steps per MLP run (default 3000; 200 with --quick)")
    p.add_argument("--rows", help="comma-separated rows or patterns to run (e.g. tfcluster_sync,tfcluster_async,pull; "
                                  "'ctr_*' for the click-through rows; saves: sharded against unsharded "
                                  "checkpoints, and increments; drift: a ps's memory on a drifting id stream; "
                                  "default: every row of the mode)")
    p.add_argument("--readme", action="store_true", help="rewrite the README's table from this run (the "
                                                         "click-through table when only ctr_* rows and the "
                                                         "bigger MLP's and CNN's maths ran)")
    p.add_argument("--profile", action="store_true", help="also trace where a ps step's time goes")
    p.add_argument("--replot", action="store_true", help="only draw --out's plots again from its results.json")
    a = p.parse_args()
    from report import CTR_BEGIN, CTR_END, replot, write, write_readme
    if a.replot:
        replot(a.out)
        print(f"bench: drew {a.out}/ratios.png and throughput.png from its results.json")
        return
    started = time.time()
    try:
        runs, extra, meta = measure(a.quick, a.steps, a.reps, a.rows.split(",") if a.rows else None)
    finally:
        shutil.rmtree(CLICKS, ignore_errors=True)
    traced = profiles(a.quick) if a.profile else {}
    thr = {k: [cluster_throughput(r) for r in v] for k, v in runs.items()}
    figs = figures(runs, thr, extra)
    meta.update(date=datetime.date.today().isoformat(), mode="quick" if a.quick else "full",
                machine=machine(),
                command="python " + " ".join(["scripts/bench.py"] + sys.argv[1:]),
                seconds=round(time.time() - started, 1),
                layouts={k: next((r["layout"] for r in v if r), "") for k, v in runs.items()})
    md = write(a.out, thr, figs, extra, meta, traced)
    if a.readme and runs and all(k.startswith("ctr_") or k in SECOND_TABLE for k in runs):
        write_readme(os.path.join(REPO, "README.md"), md, a.out, CTR_BEGIN, CTR_END)
    elif a.readme:
        write_readme(os.path.join(REPO, "README.md"), md, a.out)
    print(md)
    print(f"bench: wrote {a.out}/ in {meta['seconds']:.0f}s" + (" and the README's table" if a.readme else ""))


if __name__ == "__main__":
    main()
