"""Task servers in real processes on real ports: a graph across them, bounded waits, clean ends.

Every process is started through the ``procs`` fixture or ``run_cli`` and is
checked gone at the end with ``no_process_left``.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from concurrent import futures

import grpc
import psutil
import pytest

from conftest import base_env, no_process_left, run_cli, wait_until
from held_ports import REUSE
import tfcluster
from tfcluster.cli.start import _started_as_the_cli
from tfcluster.topology.cluster import Cluster, Task
from tfcluster.topology.ports import port_is_free
from tfcluster.runtime import shutdown
from tfcluster.runtime.server import probe
from tfcluster.topology.taskenv import huge_pages_pending, set_huge_pages, task_environment

#: A line tfcluster itself writes: a timestamped log line or the one error line.
OWN_LINE = re.compile(r"^(\d\d:\d\d:\d\d tfcluster: |tfcluster: error: )")


def raw_env(**extra):
    """A child's environment without the TF/gRPC quieting, so tfcluster must quiet them itself."""
    env = base_env(**extra)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("GRPC_VERBOSITY", None)
    return env


def family_pids(*popens):
    """The PIDs of these processes and of all their descendants, right now."""
    pids = []
    for p in popens:
        try:
            root = psutil.Process(p.pid)
            pids += [root.pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pids.append(p.pid)
    return pids


def write_cluster(tmp_path, cluster):
    path = tmp_path / "cluster.json"
    path.write_text(cluster.to_json())
    return str(path)


def wait_up(cluster, task, timeout=90):
    wait_until(lambda: probe(cluster, [task], timeout=0.5)[task] == "up", timeout,
               f"{task.device} to answer at {cluster.address(task)}")


def assert_only_own_lines(output, who):
    foreign = [line for line in output.splitlines() if line.strip() and not OWN_LINE.match(line)]
    assert not foreign, f"{who} wrote lines that are not tfcluster's own: {foreign}"


PS_AND_WORKER_SCRIPT = textwrap.dedent("""
    import tensorflow as tf
    from tfcluster import server_from_tf_config

    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    cluster, server = server_from_tf_config(timeout=60)
    with tf1.device("/job:ps/task:0"):
        v = tf1.Variable(20.0, name="v")
    with tf1.device("/job:worker/task:0"):
        y = v * 2.0 + 2.0
    with tf1.Session(server.target, config=cluster.session_config()) as sess:
        sess.run(v.initializer)
        meta = tf1.RunMetadata()
        value = sess.run(y, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE), run_metadata=meta)
    print("value", value)
    print("devices", sorted({d.device for d in meta.step_stats.dev_stats}))
""")


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_started_ps_and_a_worker_script_compute_across_processes_and_the_ps_then_exits(tmp_path, procs, ports):
    p_ps, p_w = ports(2)
    cluster = Cluster({"ps": [f"localhost:{p_ps}"], "worker": [f"localhost:{p_w}"]})
    spec = write_cluster(tmp_path, cluster)
    script = tmp_path / "worker.py"
    script.write_text(PS_AND_WORKER_SCRIPT)

    ps = procs.cli("start", "--cluster", spec, "--job", "ps", "--task", "0", env=raw_env(**REUSE))
    # Started by hand, the ps starts again at once, in place, with glibc asking for huge pages for its tables.
    if huge_pages_pending({}):
        wait_until(lambda: "glibc.malloc.hugetlb=1" in psutil.Process(ps.pid).environ().get("GLIBC_TUNABLES", ""),
                   20, "the ps to start again with glibc.malloc.hugetlb=1")
    worker = procs.cli("start", "--cluster", spec, "--job", "worker", "--task", "0", "--",
                       sys.executable, str(script), env=base_env(**REUSE))
    out, _ = worker.communicate(timeout=120)
    pids = family_pids(ps)

    assert worker.returncode == 0, out
    assert "value 42.0" in out
    devices = re.search(r"devices (\[.*\])", out).group(1)
    assert "/job:ps/replica:0/task:0/device:CPU:0" in devices
    assert "/job:worker/replica:0/task:0/device:CPU:0" in devices
    # The worker's tfcluster start told the ps it is done, so the ps ends by itself.
    ps_out, _ = ps.communicate(timeout=60)
    assert ps.returncode == 0, ps_out
    assert "every trainer is done" in ps_out
    assert_only_own_lines(ps_out, "the ps")
    assert port_is_free(p_ps) and port_is_free(p_w)
    assert no_process_left(pids + [worker.pid])


@pytest.mark.timeout(90)
def test_a_process_that_builds_no_model_serves_and_runs_ops_without_importing_keras():
    # What a hosted server and a trainer's tfcluster start (telling the ps it is done) do before importing TF.
    program = textwrap.dedent("""
        import sys
        from tfcluster.topology.taskenv import prepare_this_process
        prepare_this_process(keras=False)
        import tensorflow as tf
        server = tf.distribute.Server.create_local_server()
        with tf.compat.v1.Session(server.target, graph=tf.Graph()) as session:
            print("value", session.run(tf.constant(20.0) + 22.0))
        print("loaded", sorted({name.split(".")[0] for name, module in sys.modules.items() if module is not None}
                               & {"keras", "tf_keras", "sklearn"}))
    """)
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=base_env(), timeout=80)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines() == ["value 42.0", "loaded []"]


def test_a_ps_asks_glibc_for_huge_pages_and_a_tunable_the_user_set_is_kept():
    two = Cluster({"worker": ["localhost:1"], "ps": ["localhost:2"]})
    assert task_environment(two.with_task("ps", 0), base={})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert "GLIBC_TUNABLES" not in task_environment(two.with_task("worker", 0), base={})
    assert set_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})["GLIBC_TUNABLES"] == \
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert set_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
    assert not huge_pages_pending({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})


def test_only_the_tfcluster_command_starts_again_for_huge_pages_not_a_program_that_calls_its_main():
    assert _started_as_the_cli("/usr/local/bin/tfcluster")
    assert _started_as_the_cli(os.path.join(os.path.dirname(tfcluster.__file__), "__main__.py"))
    assert not _started_as_the_cli("train.py")


WAIT_SCRIPT = textwrap.dedent("""
    import time
    import tensorflow  # imported first, so the clock below times the server and the wait only
    from tfcluster import ClusterUnreachableError, server_from_tf_config

    start = time.monotonic()
    try:
        server_from_tf_config(timeout=3)
        print("no error")
    except ClusterUnreachableError as e:
        print("elapsed", time.monotonic() - start)
        print("error", e)
        print("missing", [str(t) for t in e.missing])
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_without_its_ps_gives_up_within_its_timeout_naming_the_ps_and_its_address(tmp_path, procs, ports):
    p_ps, p_w = ports(2)
    cluster = Cluster({"ps": [f"localhost:{p_ps}"], "worker": [f"localhost:{p_w}"]}, ("worker", 0))
    script = tmp_path / "wait.py"
    script.write_text(WAIT_SCRIPT)
    worker = procs.start([sys.executable, str(script)], env=base_env(TF_CONFIG=cluster.tf_config(), **REUSE))
    out, _ = worker.communicate(timeout=100)

    assert worker.returncode == 0, out
    assert f"error gave up after 3s waiting for /job:ps/task:0 at localhost:{p_ps}\n" in out
    assert "missing ['ps:0']" in out
    elapsed = float(re.search(r"elapsed ([\d.]+)", out).group(1))
    # It waited its 3 s and then stopped: a generous bound, to prove it does not hang.
    assert 3.0 <= elapsed < 30.0
    assert no_process_left([worker.pid])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_hosted_worker_without_its_ps_fails_in_one_line_naming_the_ps(ports):
    p_ps, p_w = ports(2)
    result = run_cli("start", "--ps", f"localhost:{p_ps}", "--worker", f"localhost:{p_w}",
                     "--job", "worker", "--task", "0", "--timeout", "3", env=raw_env(**REUSE), timeout=100)

    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"tfcluster: error: gave up after 3s waiting for /job:ps/task:0 at localhost:{p_ps}"
    assert [line for line in lines if line.startswith("tfcluster: error:")] == lines[-1:]
    # While it waited it said what for.
    assert any(f"waiting for /job:ps/task:0 at localhost:{p_ps} (" in line for line in lines[:-1]), lines
    assert "Traceback" not in result.stderr
    assert_only_own_lines(result.stderr, "the worker")
    assert port_is_free(p_w)


def hosted_ps_and_worker(tmp_path, procs, ports):
    """``(ps port, worker port, ps, worker)``: ``tfcluster start`` of a ps and of a worker with no command, both up."""
    p_ps, p_w = ports(2)
    cluster = Cluster({"ps": [f"localhost:{p_ps}"], "worker": [f"localhost:{p_w}"]})
    spec = write_cluster(tmp_path, cluster)
    ps = procs.cli("start", "--cluster", spec, "--job", "ps", "--task", "0", env=raw_env(**REUSE))
    worker = procs.cli("start", "--cluster", spec, "--job", "worker", "--task", "0", env=raw_env(**REUSE))
    wait_up(cluster, Task("ps", 0))
    wait_up(cluster, Task("worker", 0))
    return p_ps, p_w, ps, worker


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sigterm_ends_a_hosted_ps_and_worker_with_exit_0_and_frees_their_ports(tmp_path, procs, ports):
    p_ps, p_w, ps, worker = hosted_ps_and_worker(tmp_path, procs, ports)
    pids = family_pids(ps, worker)

    # A worker with no command hosts its server until it is told to stop.
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    w_out, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, w_out
    wait_until(lambda: port_is_free(p_w), 10, f"port {p_w} of worker:0 to be free")
    # The ps did not hear from a trainer, so it is still serving.
    assert ps.poll() is None
    ps.send_signal(signal.SIGTERM)
    ps_out, _ = ps.communicate(timeout=30)
    assert ps.returncode == 0, ps_out
    wait_until(lambda: port_is_free(p_ps), 10, f"port {p_ps} of ps:0 to be free")

    for out, who in ((w_out, "worker:0"), (ps_out, "ps:0")):
        assert f"{who} stopped (signal)" in out
        assert_only_own_lines(out, who)
    assert no_process_left(pids)


#: tgkill(2)'s number: the one way to signal one thread of another process.
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_hosted_worker_stops_on_a_sigterm_that_the_kernel_hands_to_one_of_its_other_threads(tmp_path, procs,
                                                                                             ports):
    # kill(2) gives a process's signal to any thread that does not block it, and TF's and gRPC's threads do not.
    # Python runs its handler on the main thread once that thread runs Python again: a main thread asleep on an
    # event with no timeout never did, and the worker hosted on after its SIGTERM (CI, 2026-12-06).
    import ctypes
    import platform
    _, _, ps, worker = hosted_ps_and_worker(tmp_path, procs, ports)
    wait_until(lambda: psutil.Process(worker.pid).num_threads() > 1, 10, "worker:0's threads")
    other = next(t.id for t in psutil.Process(worker.pid).threads() if t.id != worker.pid)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(SYS_TGKILL[platform.machine()], worker.pid, other, signal.SIGTERM) == 0, ctypes.get_errno()
    w_out, _ = worker.communicate(timeout=15)
    assert worker.returncode == 0, w_out
    assert "worker:0 stopped (signal)" in w_out
    ps.send_signal(signal.SIGTERM)
    assert ps.wait(timeout=30) == 0


def test_a_ps_sigterm_drains_while_a_trainer_answers_but_not_once_every_trainer_is_done(ports, monkeypatch):
    p_ps, p_w = ports(2)
    cluster = Cluster({"ps": [f"localhost:{p_ps}"], "worker": [f"localhost:{p_w}"]}, Task("ps", 0))
    said = []
    monkeypatch.setattr(shutdown.log, "info", lambda fmt, *args: said.append(fmt % args))

    # A trainer answers: the SIGTERM is taken over and said; the drain stops the ps once none answers.
    trainer = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    assert trainer.add_insecure_port(f"localhost:{p_w}") == p_w
    trainer.start()
    stop = threading.Event()
    assert shutdown.drain_on_sigterm(cluster, stop, grace=30, done=threading.Event())(signal.SIGTERM) is True
    wait_until(lambda: said, 10, "the drain's line")
    assert said == ["ps:0 got SIGTERM: serving on while a trainer still answers (at most 30s), so the chief can "
                    "write its last checkpoint"]
    assert not stop.is_set()
    trainer.stop(None).wait()
    assert stop.wait(10)

    # No trainer answers (the launcher stops the ps after its trainers exited): the ps stops, unannounced.
    said.clear()
    stop = threading.Event()
    assert shutdown.drain_on_sigterm(cluster, stop, grace=30, done=threading.Event())(signal.SIGTERM) is True
    assert stop.wait(10)
    assert said == []

    # Every trainer done: the ps is leaving anyway, so the signal is the caller's to stop on, unannounced.
    said.clear()
    stop, done = threading.Event(), threading.Event()
    done.set()
    assert shutdown.drain_on_sigterm(cluster, stop, grace=30, done=done)(signal.SIGTERM) is False
    assert said == [] and not stop.is_set()


DONE_TOKENS_SCRIPT = textwrap.dedent("""
    import os, random, sys, threading, time
    import tensorflow as tf
    from tfcluster.runtime import shutdown
    from tfcluster.runtime.server import task_server
    from tfcluster.topology.cluster import Cluster, Task

    port, n = int(sys.argv[1]), int(sys.argv[2])
    cluster = Cluster({"ps": [f"localhost:{port}"], "worker": [f"localhost:{i + 1}" for i in range(n)]}, Task("ps", 0))
    server = task_server(cluster)
    shutdown.DONE_POLL_SECS = 0.002          # the ps looks often: every token arrives close to some look
    stop, ended = threading.Event(), []
    ps = threading.Thread(target=lambda: ended.append(shutdown.serve_until_done(server, cluster, stop=stop)),
                          daemon=True)
    ps.start()
    graph = tf.compat.v1.Graph()
    with graph.as_default():
        who = tf.compat.v1.placeholder(tf.string, [])
        enqueue = shutdown._done_queue(Task("ps", 0)).enqueue([who])
    names = [f"worker:{i}" for i in range(n)]
    random.shuffle(names)
    with tf.compat.v1.Session(server.target, graph=graph, config=cluster.session_config()) as sess:
        for name in names:
            time.sleep(random.uniform(0, 0.004))
            sess.run(enqueue, {who: name})
    ps.join(20)
    print("ENDED", ended[0].name if ended else "NOT: the ps still serves", flush=True)
    os._exit(0)
""")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_ps_counts_every_trainers_done_token_however_it_arrives_against_its_looks(tmp_path, ports):
    # A dequeue whose run timed out as a token arrived took the token and dropped it: the ps never counted that
    # trainer and served on for ever (CI-24's sync run). 300 tokens, each within a few ms of one of the ps's looks.
    r = subprocess.run([sys.executable, "-c", DONE_TOKENS_SCRIPT, str(ports(1)[0]), "300"], capture_output=True,
                       text=True, timeout=100, cwd=str(tmp_path), env=base_env(**REUSE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ENDED DONE" in r.stdout, r.stdout + r.stderr[-2000:]


def test_a_port_in_use_is_refused_in_one_line_naming_the_task_port_and_holder(ports):
    (p_w,) = ports(1)
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli("start", "--ps", f"localhost:{port}", "--worker", f"localhost:{p_w}",
                         "--job", "ps", "--task", "0", env=raw_env())
    finally:
        holder.close()

    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    said = re.fullmatch(rf"tfcluster: error: port {port} of /job:ps/task:0 is already in use "
                        rf"\(held by pid {os.getpid()} \((.+)\)\)", line)
    assert said, line
    # The holder's command line, cut to 80 characters where it is longer (an xdist worker's is).
    command, shown = " ".join(psutil.Process().cmdline()[:4]), said.group(1)
    assert shown == command or (len(shown) == 80 and shown.endswith("...")
                                and command.startswith(shown[:-3])), (shown, command)


def test_a_probe_says_down_for_a_port_nothing_listens_on(ports):
    p_w, p_ps = ports(2)
    cluster = Cluster({"worker": [f"localhost:{p_w}"], "ps": [f"localhost:{p_ps}"]})
    assert probe(cluster, timeout=0.5) == {Task("worker", 0): "down", Task("ps", 0): "down"}


def test_status_says_unresolvable_for_a_host_that_does_not_resolve(ports):
    (p_w,) = ports(1)
    cluster = Cluster({"worker": [f"localhost:{p_w}", "no-such-host.invalid:2222"]})
    states = probe(cluster, timeout=0.5)
    assert states[Task("worker", 1)] == "unresolvable"
    assert states[Task("worker", 0)] == "down"
