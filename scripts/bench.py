#!/usr/bin/env python3
"""Benchmarks: tfcluster against hand-written TF1, TF2 ParameterServerStrategy and one process.

    python scripts/bench.py            # full figures (about 15-25 minutes on 2 cores)
    python scripts/bench.py --quick    # a smoke run for CI (under 2 minutes)
    python scripts/bench.py --rows tfcluster_sync,tfcluster_async --reps 5   # some rows only

Every figure compares A with B interleaved in one run (the order rotates each
repeat), and reports the median with its min-max spread. Results go to
``--out`` (default ``bench-results/``): results.json, results.md and, when
matplotlib is installed (``pip install -e '.[bench]'``), throughput.png.

Workloads (scripts/bench/): an MLP 784-512-10 with batch 128 per worker (per
tower, in the tower rows) on in-memory data, on 1 ps + 2 workers unless a row
says otherwise, and the tutorials' CNN.
Cluster throughput is measured over the window in which every worker was
stepping, from each worker's step timeline, so a worker that starts late
(raw TF1's non-chief waits 30 s for the model) does not distort it.
"""

import argparse
import datetime
import functools
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BENCH = os.path.join(HERE, "bench")
sys.path.insert(0, REPO)

from tfcluster.ports import pick_free_ports  # noqa: E402

PY = sys.executable


def child_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", GRPC_VERBOSITY="NONE", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TF_CONFIG", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def parse_bench(text):
    """Every ``BENCH {...}`` line a run printed, as dicts."""
    out = []
    for line in text.splitlines():
        i = line.find("BENCH ")
        if i >= 0:
            out.append(json.loads(line[i + 6:]))
    return out


# --------------------------------------------------------------- one run each
def run_local(workload, ps=1, workers=2, extra=(), timeout=300):
    """Run a workload under ``tfcluster local``; return its results and the launch/exit times."""
    logs = tempfile.mkdtemp(prefix="tfcbench-")
    cmd = [PY, "-m", "tfcluster", "local", "--ps", str(ps), "--workers", str(workers), "--log-dir", logs,
           "--timeout", str(timeout - 10), *extra, "--", PY, *workload]
    launched = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    exited = time.time()
    shutil.rmtree(logs, ignore_errors=True)
    results = parse_bench(p.stdout)
    if p.returncode != 0 or len(results) < max(workers, 1):
        raise RuntimeError(f"{' '.join(workload)} failed (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return dict(launched=launched, exited=exited, results=results, layout=f"{workers} workers, {ps} ps")


def run_single(workload, timeout=600):
    """Run a workload as one plain process (no cluster)."""
    launched = time.time()
    p = subprocess.run([PY, *workload], capture_output=True, text=True, timeout=timeout, env=child_env())
    results = parse_bench(p.stdout)
    if p.returncode != 0 or not results:
        raise RuntimeError(f"{' '.join(workload)} failed (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return dict(launched=launched, exited=time.time(), results=results, layout="1 process")


def run_tf2_pss(steps_seconds, timeout=600):
    """TF2 ParameterServerStrategy: ps and workers serve, the chief coordinates and measures."""
    ports = pick_free_ports(4)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"],
               "ps": [f"localhost:{ports[3]}"]}
    script = os.path.join(BENCH, "tf2_pss.py")
    servers = []

    def env(kind, i):
        return child_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}}),
                         BENCH_SECONDS=steps_seconds)
    try:
        for kind, n in (("ps", 1), ("worker", 2)):
            for i in range(n):
                servers.append(subprocess.Popen([PY, script], env=env(kind, i), stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL, start_new_session=True))
        launched = time.time()
        p = subprocess.run([PY, script], capture_output=True, text=True, timeout=timeout, env=env("chief", 0))
    finally:
        for s in servers:  # they serve forever by design; ours to end
            s.kill()
            s.wait()
    results = parse_bench(p.stdout)
    if p.returncode != 0 or not results:
        raise RuntimeError(f"tf2_pss failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return dict(launched=launched, exited=time.time(), results=results, layout="chief, 2 workers, 1 ps")


def tcp_loopback_bps(megabytes=64, seconds=3.0):
    """Plain TCP bytes/s over loopback between two threads, the bench's own socket pair."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    payload = b"\0" * (megabytes << 20)
    received = [0]

    def sink():
        c, _ = srv.accept()
        buf = bytearray(1 << 20)
        while True:
            n = c.recv_into(buf)
            if not n:
                break
            received[0] += n
        c.close()
    t = threading.Thread(target=sink)
    t.start()
    c = socket.create_connection(srv.getsockname())
    start = time.time()
    while time.time() - start < seconds:
        c.sendall(payload)
    c.close()
    t.join()
    elapsed = time.time() - start
    srv.close()
    return received[0] / elapsed


def tf_import_seconds():
    """Wall seconds for a fresh Python to import TensorFlow (the floor of any start-up)."""
    t = time.time()
    subprocess.run([PY, "-c", "import tensorflow"], check=True, env=child_env(), capture_output=True)
    return time.time() - t


# ------------------------------------------------------------------- metrics
def _steps_at(timeline, t):
    pts = sorted(timeline)
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, s0), (t1, s1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return s0 + (s1 - s0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
    return pts[-1][1]


def cluster_throughput(run):
    """Examples/s of the whole cluster over the window in which every worker stepped (None: the run failed)."""
    if run is None:
        return None
    rs = run["results"]
    if len(rs) == 1 and rs[0].get("cluster_total") or "timeline" not in rs[0]:
        return sum(r["examples_per_sec"] for r in rs)
    start = max(r["first_step_at"] for r in rs)
    end = min(r["last_step_at"] for r in rs)
    if end - start < 1.0:  # no real overlap: fall back to each worker's own rate
        return sum(r["examples_per_sec"] for r in rs)
    examples = sum((_steps_at(r["timeline"], end) - _steps_at(r["timeline"], start)) * r["batch"] for r in rs)
    return examples / (end - start)


def first_steps_after_launch(run):
    """Seconds from launch until every worker had taken its first step."""
    if run is None:
        return None
    return max(r["first_step_at"] for r in run["results"]) - run["launched"]


def teardown_seconds(run):
    """Seconds from the last step of any worker to the launcher's exit (every process gone)."""
    if run is None:
        return None
    return run["exited"] - max(r["last_step_at"] for r in run["results"])


def summary(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return dict(median=statistics.median(values), min=min(values), max=max(values), n=len(values),
                values=values)


# -------------------------------------------------------------------- driver
def measure(quick, steps=None, reps=None, rows=None):
    steps = steps or (200 if quick else 3000)
    reps = reps or (1 if quick else 3)
    fit = os.path.join(BENCH, "tfcluster_fit.py")
    raw = os.path.join(BENCH, "raw_tf1.py")
    configs = {
        "tfcluster_async": lambda: run_local([fit, "--mode", "async", "--steps", str(steps)]),
        "raw_tf1_async": lambda: run_local([raw, "--steps", str(steps)], extra=["--legacy-flags"]),
        "single_b128": lambda: run_single([fit, "--mode", "local", "--steps", str(steps)]),
    }
    if not quick:
        configs["tfcluster_sync"] = lambda: run_local([fit, "--mode", "sync", "--steps", str(steps)])
        configs["tfcluster_async_1w"] = lambda: run_local([fit, "--mode", "async", "--steps", str(steps // 2)],
                                                          workers=1)
        configs["single_b256"] = lambda: run_single([fit, "--mode", "local", "--steps", str(steps // 2),
                                                     "--batch", "256"])
        configs["tf2_pss"] = lambda: run_tf2_pss(20)
        configs["tfcluster_async_cnn"] = lambda: run_local([fit, "--mode", "async", "--model", "cnn",
                                                            "--steps", str(steps // 3)])
        configs["single_cnn"] = lambda: run_single([fit, "--mode", "local", "--model", "cnn",
                                                    "--steps", str(steps // 3)])
        try:  # towers and all-reduce land with issue 5; measure them when present
            from tfcluster.strategies import get
            get("mirrored")
            for n in (2, 4):
                configs[f"mirrored_{n}"] = (lambda n=n: run_single(
                    [fit, "--mode", "mirrored", "--devices", str(n), "--steps", str(steps // n), "--batch", "128"]))
            configs["central_2"] = lambda: run_single([fit, "--mode", "central", "--devices", "2",
                                                       "--steps", str(steps // 2)])
            configs["collective_2w"] = lambda: run_local([fit, "--mode", "collective", "--steps", str(steps)], ps=0)
            configs["collective_2w_towers_2"] = lambda: run_local(
                [fit, "--mode", "collective", "--devices", "2", "--steps", str(steps // 2)], ps=0)
            configs["tfcluster_sync_towers_2"] = lambda: run_local(
                [fit, "--mode", "sync", "--devices", "2", "--steps", str(steps // 2)])
        except Exception:
            pass
    if rows is not None:
        unknown = sorted(set(rows) - set(configs) - {"pull"})
        if unknown:
            raise SystemExit(f"bench: no row {', '.join(unknown)} in {'quick' if quick else 'full'} mode; "
                             f"rows: {', '.join(list(configs) + ['pull'])}")
        configs = {k: v for k, v in configs.items() if k in rows}
    runs = {name: [] for name in configs}
    names = list(configs)
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)] if names else []
        for name in order:
            t = time.time()
            try:
                runs[name].append(configs[name]())
                print(f"bench: {name} rep {rep + 1}/{reps}: {cluster_throughput(runs[name][-1]):.0f} examples/s "
                      f"({time.time() - t:.0f}s)", flush=True)
            except Exception as e:  # a broken row is reported, not fatal to the others
                runs[name].append(None)  # keeps every row's repeats aligned for the paired ratios
                print(f"bench: {name} rep {rep + 1} failed: {str(e).splitlines()[0]}", flush=True)

    pull_env_mb = 16 if quick else 64
    pulls, wholes, tcps, imports = [], [], [], []
    for _ in range(reps):
        imports.append(tf_import_seconds())
        if rows is not None and "pull" not in rows:
            continue
        tcps.append(tcp_loopback_bps(pull_env_mb, 2.0 if quick else 4.0))
        pull = subprocess.run([PY, "-m", "tfcluster", "local", "--ps", "1", "--workers", "1", "--", PY,
                               os.path.join(BENCH, "pull.py")], capture_output=True, text=True, timeout=300,
                              env=child_env(BENCH_PULL_MB=pull_env_mb, BENCH_SECONDS=2 if quick else 5))
        r = parse_bench(pull.stdout)
        pulls.append(r[0]["bytes_per_sec"] if r else None)
        wholes.append(r[0]["whole_bytes_per_sec"] if r else None)
    return runs, dict(pull=pulls, pull_whole=wholes, tcp=tcps, tf_import=imports), dict(steps=steps, reps=reps)


def ratio(a, b):
    """Per-repeat ratios a[i]/b[i] (the pairs were measured side by side; a failed repeat is None)."""
    return [x / y for x, y in zip(a, b) if x and y]


def best(a, b):
    """Per-repeat best of two rows (None where both failed)."""
    return [max([v for v in pair if v], default=None) for pair in zip(a, b)]


def figures(runs, extra):
    thr = {k: [cluster_throughput(r) for r in v] for k, v in runs.items()}
    f = {}

    def pair(name, a, b, goal=""):
        if thr.get(a) and thr.get(b):
            f[name] = (ratio(thr[a], thr[b]), goal)

    pair("P1 tfcluster async / raw TF1 async", "tfcluster_async", "raw_tf1_async", ">= 1.2")
    pair("P2 tfcluster async / TF2 PSS", "tfcluster_async", "tf2_pss", ">= 2.5")
    pair("P3 tfcluster sync / async", "tfcluster_sync", "tfcluster_async", ">= 0.85")
    # The best of every one-process MLP row, repeat by repeat: plain, larger batch, towers.
    singles = [thr[k] for k in ("single_b128", "single_b256", "mirrored_2", "mirrored_4", "central_2") if thr.get(k)]
    if singles:
        thr["best_single"] = functools.reduce(best, singles)
        pair("P4 cluster total / best single process", "tfcluster_async", "best_single", ">= 0.9")
        del thr["best_single"]
    pair("P4 for the CNN: cluster total / single process", "tfcluster_async_cnn", "single_cnn", ">= 0.9")
    if runs.get("tfcluster_async") and extra.get("tf_import"):
        imp = statistics.median(extra["tf_import"])
        f["P5 s launch to every first step (tfcluster)"] = (
            [first_steps_after_launch(r) for r in runs["tfcluster_async"]],
            f"<= {imp + 2:.1f} (TF import {imp:.1f} + 2)")
        f["P6 s last step to every process gone"] = ([teardown_seconds(r) for r in runs["tfcluster_async"]], "<= 2")
    if runs.get("raw_tf1_async"):
        f["P5 s launch to every first step (raw TF1)"] = (
            [first_steps_after_launch(r) for r in runs["raw_tf1_async"]], "peer")
    if extra.get("pull"):
        f["P7 ps pull bytes/s / TCP loopback bytes/s"] = (ratio(extra["pull"], extra["tcp"]), ">= 0.5")
        f["P7 one whole variable, as plain TF places it / TCP"] = (ratio(extra["pull_whole"], extra["tcp"]), "peer")
    pair("async 2 workers / async 1 worker", "tfcluster_async", "tfcluster_async_1w")
    for n in (2, 4):
        pair(f"towers {n} virtual devices / single_b128", f"mirrored_{n}", "single_b128")
    pair("central storage 2 devices / single_b128", "central_2", "single_b128")
    pair("collective 2 workers / single_b128", "collective_2w", "single_b128")
    pair("collective 2 workers x 2 towers / single_b128", "collective_2w_towers_2", "single_b128")
    pair("ps sync x 2 towers / ps sync", "tfcluster_sync_towers_2", "tfcluster_sync")
    return thr, {k: dict(summary(v) or {}, goal=g) for k, (v, g) in f.items()}


def layouts(runs):
    """Each row's processes (e.g. ``2 workers, 1 ps``), from its first run that worked."""
    return {k: next((r["layout"] for r in v if r), "") for k, v in runs.items()}


def write(out, thr, figs, extra, meta, layout):
    os.makedirs(out, exist_ok=True)
    doc = dict(meta, throughput={k: summary(v) for k, v in thr.items()}, figures=figs,
               pull_bytes_per_sec=summary(extra["pull"]), pull_whole_bytes_per_sec=summary(extra["pull_whole"]),
               tcp_bytes_per_sec=summary(extra["tcp"]), layouts=layout,
               tf_import_seconds=summary(extra["tf_import"]))
    with open(os.path.join(out, "results.json"), "w") as fh:
        json.dump(doc, fh, indent=2)
    lines = [f"Measured {meta['date']} on {meta['machine']} ({meta['mode']} mode, {meta['reps']} repeat(s), "
             f"{meta['steps']} steps), with `{meta['command']}`.", "",
             "| figure | median | spread (min-max) | goal |", "|---|---|---|---|"]
    for k, v in figs.items():
        if v.get("median") is not None:
            lines.append(f"| {k} | {v['median']:.2f} | {v['min']:.2f}-{v['max']:.2f} | {v['goal']} |")
    lines += ["", "| run | processes | median examples/s | spread |", "|---|---|---|---|"]
    for k, v in thr.items():
        s = summary(v)
        if s:
            lines.append(f"| {k} | {layout.get(k, '')} | {s['median']:.0f} | {s['min']:.0f}-{s['max']:.0f} |")
    with open(os.path.join(out, "results.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed (pip install -e '.[bench]'); no plot", flush=True)
        return
    rows = {k: summary(v) for k, v in thr.items() if summary(v)}
    names = list(rows)
    med = [rows[k]["median"] for k in names]
    lo = [rows[k]["median"] - rows[k]["min"] for k in names]
    hi = [rows[k]["max"] - rows[k]["median"] for k in names]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    ax.barh([f"{k} ({layout.get(k, '')})" for k in names], med, xerr=[lo, hi], color="#4477aa")
    ax.invert_yaxis()
    ax.set_xlabel("examples/s (whole cluster; median, min-max)")
    ax.set_title(f"tfcluster throughput, {meta['date']}, {meta['machine']}")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one short repeat of the core rows (CI smoke run)")
    p.add_argument("--out", default="bench-results", help="directory for results.json/.md/.png")
    p.add_argument("--reps", type=int, help="repeats of every row (default 3; 1 with --quick)")
    p.add_argument("--steps", type=int, help="global steps per MLP run (default 3000; 200 with --quick)")
    p.add_argument("--rows", help="comma-separated rows to run (e.g. tfcluster_sync,tfcluster_async,pull; "
                                  "default: every row of the mode)")
    a = p.parse_args()
    started = time.time()
    runs, extra, meta = measure(a.quick, a.steps, a.reps, a.rows.split(",") if a.rows else None)
    thr, figs = figures(runs, extra)
    meta.update(date=datetime.date.today().isoformat(), mode="quick" if a.quick else "full",
                machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                command="python " + " ".join(["scripts/bench.py"] + sys.argv[1:]),
                seconds=round(time.time() - started, 1))
    write(a.out, thr, figs, extra, meta, layouts(runs))
    with open(os.path.join(a.out, "results.md")) as fh:
        print(fh.read())
    print(f"bench: wrote {a.out}/ in {meta['seconds']:.0f}s")


if __name__ == "__main__":
    main()
