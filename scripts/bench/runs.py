"""How the bench runs a workload once: under ``tfcluster local``, as one process, as TF2 ParameterServerStrategy's
cluster, or as TF's MultiWorkerMirroredStrategy set up by hand; each returns the run's BENCH lines and times."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from tfcluster.topology.ports import pick_free_ports

PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "scripts", "bench")


def child_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", GRPC_VERBOSITY="NONE", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("TF_CONFIG", "TFCLUSTER_WIRE", "TFCLUSTER_STRATEGY", "TFCLUSTER_MATH", "TFCLUSTER_PREFETCH"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def parse_bench(text, marker="BENCH "):
    """Every ``BENCH {...}`` line a run printed, as dicts."""
    out = []
    for line in text.splitlines():
        i = line.find(marker)
        if i >= 0:
            out.append(json.loads(line[i + len(marker):]))
    return out


def layout(workers, ps=0, chief=False):
    """``1 worker, 1 ps``, ``2 workers``, ``chief, 2 workers, 1 ps``: a row's processes, in words."""
    parts = (["chief"] if chief else []) + [f"{workers} worker{'' if workers == 1 else 's'}"]
    return ", ".join(parts + ([f"{ps} ps"] if ps else []))


# --------------------------------------------------------------- one run each
def run_local(workload, ps=1, workers=2, extra=(), timeout=400, memory=False):
    """Run a workload under ``tfcluster local``; return its results and the launch/exit times.

    ``memory``: each ps in a memory cgroup (``--ps-memory``, root only) so the run also says each ps's peak
    memory (``ps_peak``) and the bytes of variables it held (``ps_state``), ``{"ps:0": bytes}``.
    """
    logs = tempfile.mkdtemp(prefix="tfcbench-")
    if memory:
        extra = [*extra, "--ps-memory", "20G"]
    cmd = [PY, "-m", "tfcluster", "local", "--ps", str(ps), "--workers", str(workers), "--log-dir", logs,
           "--timeout", str(timeout - 10), *extra, "--", PY, *workload]
    launched = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    exited = time.time()
    state = _read_json(os.path.join(logs, "ps-state.json"))
    shutil.rmtree(logs, ignore_errors=True)
    results = parse_bench(p.stdout)
    if p.returncode != 0 or len(results) < max(workers, 1):
        raise RuntimeError(f"{' '.join(workload)} failed (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    run = dict(launched=launched, exited=exited, results=results, layout=layout(workers, ps))
    if memory:
        run.update(ps_peak=ps_peaks(p.stdout + p.stderr), ps_state=state)
    return run


_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def ps_peaks(text):
    """``{"ps:0": bytes}`` from the launcher's ``ps memory: ps:0 peak 620.6 MB, ...`` line."""
    return {m.group(1): float(m.group(2)) * _UNITS[m.group(3)]
            for m in re.finditer(r"(ps:\d+) peak ([\d.]+) ([KMGT]?B)\b", text)}


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_single(workload, timeout=600, **env_extra):
    """Run a workload as one plain process (no cluster)."""
    launched = time.time()
    p = subprocess.run([PY, *workload], capture_output=True, text=True, timeout=timeout, env=child_env(**env_extra))
    results = parse_bench(p.stdout)
    if p.returncode != 0 or not results:
        raise RuntimeError(f"{' '.join(workload)} failed (exit {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return dict(launched=launched, exited=time.time(), results=results, layout="1 process")


def run_tf2_pss(steps, timeout=600, script="tf2_pss.py", ps=1, **env_extra):
    """TF2 ParameterServerStrategy: ps and workers serve, the chief coordinates and measures."""
    ports = pick_free_ports(3 + ps)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}", f"localhost:{ports[2]}"],
               "ps": [f"localhost:{port}" for port in ports[3:]]}
    script = os.path.join(BENCH, script)
    servers = []

    def env(kind, i):
        return child_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}}),
                         BENCH_STEPS=steps, **env_extra)
    try:
        for kind, n in (("ps", ps), ("worker", 2)):
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
    return dict(launched=launched, exited=time.time(), results=results, layout=layout(2, ps, chief=True))


def run_by_hand(workload, workers=2, timeout=600, **env_extra):
    """TF's MultiWorkerMirroredStrategy set up by hand: ``workers`` plain processes on TF_CONFIG, no tfcluster."""
    cluster = {"worker": [f"localhost:{port}" for port in pick_free_ports(workers)]}
    procs = []
    launched = time.time()
    try:
        for i in range(workers):
            procs.append(subprocess.Popen(
                [PY, *workload], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                env=child_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}),
                              **env_extra)))
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:         # a worker left waiting for a dead peer is ours to end
            if p.poll() is None:
                p.kill()
                p.wait()
    results = [r for out, _ in outs for r in parse_bench(out)]
    if any(p.returncode for p in procs) or len(results) < workers:
        raise RuntimeError(f"{' '.join(workload)} by hand failed (exits {[p.returncode for p in procs]}):\n"
                           f"{outs[0][1][-2000:]}")
    return dict(launched=launched, exited=time.time(), results=results, layout=layout(workers))


#: What each host's link carries in the rows that give every task a host of its own (tc's token bucket).
LINK_RATE = "200mbit"


def run_hosts(workload, ps=1, workers=2, rate=LINK_RATE, timeout=900):
    """Each task on a host of its own: network namespaces on one switch (tests/netns.py, link-local addresses),
    every host's link limited to ``rate``, each task started by ``tfcluster start``. Root only: a step's bytes
    then cross a link that binds, as between machines, where ``tfcluster local``'s loopback never does."""
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from netns import Hosts, unavailable_reason
    why = unavailable_reason()
    if why:
        raise RuntimeError(f"hosts of their own need network namespaces: {why}")
    procs = []
    launched = time.time()
    with Hosts(ps + workers) as hosts, tempfile.TemporaryDirectory(prefix="tfcbench-hosts-") as tmp:
        for name in hosts.names:
            subprocess.run(["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
                            rate, "burst", "256kb", "latency", "100ms"], check=True, capture_output=True, timeout=10)
        # A namespace has a port space of its own, empty: the same port on every host is free.
        spec = os.path.join(tmp, "cluster.json")
        addresses = [f"{a}:2222" for a in hosts.addresses]
        with open(spec, "w") as f:
            json.dump({"ps": addresses[:ps], "worker": addresses[ps:]}, f)
        start = [PY, "-m", "tfcluster", "start", "--cluster", spec]
        try:
            for i in range(ps + workers):
                job, task = ("ps", i) if i < ps else ("worker", i - ps)
                command = start + ["--job", job, "--task", str(task)]
                command += ["--", PY, *workload] if job == "worker" else []
                procs.append(subprocess.Popen(hosts.exec_prefix(i) + command, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                              env=child_env()))
            outs = [p.communicate(timeout=timeout)[0] for p in procs[ps:]]
            for p in procs[:ps]:            # a ps goes once its workers are done; one that does not is ended below
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
                    p.wait()
    results = [r for out in outs for r in parse_bench(out)]
    if any(p.returncode for p in procs[ps:]) or len(results) < workers:
        raise RuntimeError(f"{' '.join(workload)} on hosts of their own failed "
                           f"(exits {[p.returncode for p in procs]}):\n{outs[0][-2000:]}")
    return dict(launched=launched, exited=time.time(), results=results,
                layout=layout(workers, ps) + f", each on a host of its own ({rate} links)")
