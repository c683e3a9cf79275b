"""`tfcluster local`: a whole cluster from one command, supervised, with clean shutdown.

Every test starts the real launcher in a real process; its tasks are real
processes (real TensorFlow servers where a test trains). A watcher thread
records every process of the launcher's tree while it runs, so each test can
check that none is left afterwards.
"""

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import Procs, base_env, kill_tree, live_process, no_process_left, run_cli, wait_until
from tfcluster import Task
from tfcluster.core import posix
from tfcluster.launch import Ending, LaunchConfig, LocalLauncher
from tfcluster.launch.processes import bound_command

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
PY = sys.executable


def script(name, *args):
    """The command that runs tests/scripts/NAME with ARGS."""
    return [PY, os.path.join(SCRIPTS, name), *args]


class Run:
    """A running ``tfcluster local``: its output line by line, and every process of its tree."""

    def __init__(self, procs, args, cwd, **env):
        self.proc = procs.cli("local", *[str(a) for a in args], cwd=str(cwd), env=base_env(**env))
        self.lines = []
        self.handles = {}       # pid -> psutil.Process, for every process ever seen in the tree
        self.last_seen = {}     # pid -> time.monotonic() when last seen alive
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._watch, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def _watch(self):
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.proc.pid)
                for p in [root] + root.children(recursive=True):
                    self.handles.setdefault(p.pid, p)
            except psutil.Error:
                pass
            now = time.monotonic()
            for pid, p in list(self.handles.items()):
                try:
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        self.last_seen[pid] = now
                except psutil.Error:
                    pass
            time.sleep(0.02)

    def wait_for(self, pattern, timeout):
        """The first output line matching ``pattern``; fail naming it after ``timeout`` s."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if rx.search(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._threads[0].is_alive():
                    raise AssertionError(f"no line matching {pattern!r} within {timeout}s; output:\n"
                                         + "\n".join(self.lines[-40:]))
                self._cond.wait(min(left, 0.2))

    def finish(self, timeout):
        """Wait for the launcher to exit; return its code once every process of its tree is gone."""
        code = self.proc.wait(timeout=timeout)
        self._threads[0].join(10)
        no_process_left(list(self.handles), timeout=10)
        time.sleep(0.1)   # one more watcher pass, so last_seen is final
        self._stop.set()
        self._threads[1].join(5)
        return code

    @property
    def output(self):
        return "\n".join(self.lines)

    def pids(self, task):
        """The pids a task printed (``[worker:1] pid 123``), one per start."""
        return [int(m.group(1)) for m in
                (re.match(rf"\[{re.escape(task)}\] pid (\d+)$", line) for line in self.lines) if m]

    def started(self, task):
        """The pids the launcher announced for a task (``[tfcluster] ps:0 started (pid 123)``)."""
        return [int(m.group(1)) for m in
                (re.match(rf"\[tfcluster\] {re.escape(task)} (?:re)?started \(pid (\d+)\)", line)
                 for line in self.lines) if m]

    def alive(self):
        """Processes of this run's tree that are still running."""
        out = []
        for p in self.handles.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out


# ------------------------------------------------------ a whole training run
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 1 ps + 2 worker run of counter.py, finished; shared by the tests that read it."""
    procs = Procs()
    cwd = tmp_path_factory.mktemp("local")
    run = Run(procs, ["--ps", 1, "--workers", 2, "--timeout", 150, "--"] + script("counter.py"),
              cwd, TFCLUSTER_DEBUG=1)
    try:
        run.code = run.finish(timeout=170)
        run.cwd = cwd
        yield run
    finally:
        procs.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_1ps_2worker_cluster_trains_to_the_end_and_the_launcher_exits_0(trained):
    assert trained.code == 0, trained.output
    # Each worker saw all six increments on the one variable on ps:0.
    assert "[worker:0] total 6" in trained.lines
    assert "[worker:1] total 6" in trained.lines


@pytest.mark.slow
def test_no_process_of_the_run_is_left_afterwards(trained):
    workers = trained.pids("worker:0") + trained.pids("worker:1")
    assert workers == trained.started("worker:0") + trained.started("worker:1")
    ps = trained.started("ps:0")
    everyone = [trained.proc.pid] + ps + workers
    assert len(everyone) == 4 and set(everyone) <= set(trained.handles)
    assert no_process_left(everyone + list(trained.handles))
    assert trained.alive() == []


@pytest.mark.slow
def test_the_ps_is_hosted_by_tfcluster_start_and_the_workers_run_the_command(trained):
    assert re.search(r"\[tfcluster\] ps:0 started \(pid \d+\): \S+ -m tfcluster start --cluster \S+cluster.json "
                     r"--job ps --task 0 --stop-grace 30$", trained.output, re.M), trained.output
    assert re.search(r"\[tfcluster\] worker:1 started \(pid \d+\): \S+ \S+counter.py$", trained.output, re.M)


@pytest.mark.slow
def test_a_ps_told_every_trainer_is_done_says_it_exits_and_takes_the_launchers_stop_without_a_drain(trained):
    ps = [line for line in trained.lines if line.startswith("[ps:0] ")]
    assert any(line.endswith("every trainer is done; ps:0 exits") for line in ps), "\n".join(ps)
    # The launcher's SIGTERM reaches a ps that is leaving anyway: announcing a drain would contradict it.
    assert not any("got SIGTERM" in line for line in ps), "\n".join(ps)
    assert ps[-1].endswith("ps:0 stopped (all trainers done)")


@pytest.mark.slow
def test_every_task_line_is_shown_prefixed_with_its_task_and_the_launcher_lines_with_tfcluster(trained):
    for task in ("ps:0", "worker:0", "worker:1"):
        assert any(line.startswith(f"[{task}] ") for line in trained.lines), task
    assert any(re.match(r"\[ps:0\] .*ps:0 serving on localhost:\d+", line) for line in trained.lines)
    assert "[worker:0] step 3 counter=" in trained.output
    assert re.search(r"^\[tfcluster\] logs: tfcluster-logs/\S+ \(one file per task\)$", trained.output, re.M)
    assert trained.lines[-1] == "[tfcluster] done: 2 trainer(s) succeeded"
    unprefixed = [line for line in trained.lines if not re.match(r"\[(tfcluster|ps:0|worker:[01])\] ", line)]
    assert unprefixed == []


@pytest.mark.slow
def test_each_task_has_a_log_file_in_the_announced_dir_with_its_own_lines_unprefixed(trained):
    log_dir = trained.cwd / re.search(r"\[tfcluster\] logs: (\S+)", trained.output).group(1)
    assert sorted(os.listdir(log_dir)) == ["cluster.json", "ps-0.log", "worker-0.log", "worker-1.log"]
    for task in ("worker:0", "worker:1"):
        text = (log_dir / f"{task.replace(':', '-')}.log").read_text()
        mine = [line[len(task) + 3:] for line in trained.lines if line.startswith(f"[{task}] ")]
        assert text.splitlines() == mine
        assert text.startswith(f"pid {trained.pids(task)[0]}\n") and "total 6\n" in text
    assert "ps:0 serving on" in (log_dir / "ps-0.log").read_text()
    spec = json.loads((log_dir / "cluster.json").read_text())
    assert sorted(spec) == ["ps", "worker"] and len(spec["worker"]) == 2
    # Each log starts with its task's argv, and the spec lists servers that run any graph: private.py.
    assert {n: (log_dir / n).stat().st_mode & 0o777 for n in os.listdir(log_dir)} == dict.fromkeys(
        ["cluster.json", "ps-0.log", "worker-0.log", "worker-1.log"], 0o600)
    assert log_dir.stat().st_mode & 0o777 == 0o700


@pytest.mark.slow
def test_every_process_is_gone_within_2s_of_the_last_worker_exit(trained):
    workers = trained.pids("worker:0") + trained.pids("worker:1")
    last_worker = max(trained.last_seen[p] for p in workers)
    last_task = max(t for pid, t in trained.last_seen.items() if pid != trained.proc.pid)
    last_any = max(trained.last_seen.values())
    reported = float(re.search(r"every task process was gone ([\d.]+)s after the last trainer exited",
                               trained.output).group(1))
    print(f"\nlast worker exit -> last task process gone: {last_task - last_worker:.2f}s "
          f"(launcher's own measure {reported:.2f}s); -> launcher gone: {last_any - last_worker:.2f}s")
    # The launcher's promise, measured from outside with a 20 ms watcher (plus slack for this loaded machine).
    assert last_task - last_worker < 2.5
    assert reported < 2.0


# ------------------------------------------------------------------ failures
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_that_exits_3_makes_the_launcher_exit_3_and_name_it_and_its_log(procs, tmp_path):
    run = Run(procs, ["--ps", 1, "--workers", 2, "--log-dir", tmp_path / "logs", "--"]
              + script("counter.py", "--fail-task", "worker:1", "--exit-code", "3"), tmp_path)
    assert run.finish(timeout=90) == 3, run.output
    line = run.wait_for(r"\[tfcluster\] error: worker:1 ", 1)
    assert "worker:1 exited with code 3" in line and str(tmp_path / "logs" / "worker-1.log") in line
    assert "[worker:1] worker:1 fails on purpose with code 3" in run.lines
    assert run.lines[-1] == f"[tfcluster] ended: worker:1 failed for good (exit code 3); logs: {tmp_path / 'logs'}"
    assert run.alive() == []


@pytest.mark.timeout(60)
def test_the_launchers_result_says_why_the_run_ended_which_task_ended_it_and_how_each_task_ended(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exit_3_on_worker_1 = ("import json, os, sys; "
                          "sys.exit(3 if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1 else 0)")
    failed = LocalLauncher(LaunchConfig([PY, "-c", exit_3_on_worker_1], ps=0, workers=2, isolate=False)).launch()
    assert (failed.ending, failed.exit_code, failed.failed) == (Ending.TASK_FAILED, 3, Task("worker", 1))
    assert not failed.succeeded and failed.task("worker:1").returncode == 3
    assert failed.task(Task("worker", 1)).log_path == os.path.join(failed.log_dir, "worker-1.log")
    assert failed.closing_line() == f"ended: worker:1 failed for good (exit code 3); logs: {failed.log_dir}"

    done = LocalLauncher(LaunchConfig([PY, "-c", "pass"], ps=0, workers=2, isolate=False)).launch()
    assert (done.ending, done.exit_code, done.failed) == (Ending.SUCCEEDED, 0, None) and done.succeeded
    assert [(str(r.task), r.returncode, r.restarts) for r in done.tasks] == [("worker:0", 0, 0), ("worker:1", 0, 0)]
    assert done.closing_line() == "done: 2 trainer(s) succeeded"

    # worker:0 runs until worker:1 is back, so it is running when worker:1 fails: two trainers and no ps
    # form one all-reduce group, which restarts together (had worker:0 already finished, worker:1 would
    # restart alone, and which came first would be a race).
    exit_3_once_on_worker_1 = ("import json, os, sys, time\n"
                               "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 0:\n"
                               "    while not os.path.exists('back'): time.sleep(0.05)\n"
                               "elif not os.path.exists('failed'):\n"
                               "    open('failed', 'w').close(); sys.exit(3)\n"
                               "else:\n"
                               "    open('back', 'w').close()\n")
    recovered = LocalLauncher(LaunchConfig([PY, "-c", exit_3_once_on_worker_1], ps=0, workers=2, isolate=False,
                                           max_restarts=1)).launch()
    assert recovered.succeeded and recovered.task("worker:1").restarts == 1
    assert recovered.closing_line() == "done: 2 trainer(s) succeeded; restarts: worker:0 1, worker:1 1"


@pytest.mark.timeout(60)
def test_a_launcher_run_in_process_sweeps_its_tasks_orphans_and_never_the_callers_own_children(tmp_path, monkeypatch):
    # A final sweep that took every child of the process killed the test worker's fork server (official CI of 06f1092).
    monkeypatch.chdir(tmp_path)
    mine = subprocess.Popen(["sleep", "60"])
    try:
        leave_an_orphan = ("import subprocess; orphan = subprocess.Popen(['sleep', '60'], start_new_session=True); "
                           "open('orphan', 'w').write(str(orphan.pid))")
        result = LocalLauncher(LaunchConfig([PY, "-c", leave_an_orphan], ps=0, workers=1, isolate=False,
                                            subreaper=True)).launch()
        assert result.succeeded, result.closing_line()
        orphan = int((tmp_path / "orphan").read_text())
        wait_until(lambda: live_process(orphan) is None, 10, f"the orphan {orphan} to be stopped")
        assert mine.poll() is None          # alive, and not reaped by the launcher either
        flag = ctypes.c_int(-1)
        assert posix.prctl()(37, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 0    # PR_GET_CHILD_SUBREAPER
    finally:
        mine.kill()
        mine.wait()


def test_a_worker_killed_by_a_signal_makes_the_launcher_exit_128_plus_the_signal(procs, tmp_path):
    run = Run(procs, ["--ps", 0, "--workers", 1, "--"] + script("sleeper.py", "--no-tree"), tmp_path)
    run.wait_for(r"^\[worker:0\] ready$", 60)
    os.kill(run.pids("worker:0")[0], signal.SIGKILL)
    assert run.finish(timeout=30) == 128 + signal.SIGKILL
    assert re.search(r"^\[tfcluster\] error: worker:0 was killed by SIGKILL; see its log: \S+worker-0.log$",
                     run.output, re.M), run.output
    assert run.alive() == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_to_the_launcher_stops_the_whole_tree_with_no_orphans_and_exit_143(procs, tmp_path):
    run = Run(procs, ["--ps", 1, "--workers", 2, "--"] + script("sleeper.py"), tmp_path)
    for task in ("worker:0", "worker:1"):
        run.wait_for(rf"^\[{task}\] ready$", 60)
    run.wait_for(r"^\[ps:0\] .*ps:0 is up", 90)
    escaped = [int(x) for line in run.lines if "grandchildren" in line for x in line.split()[-2:]]
    assert len(escaped) == 4 and all(psutil.pid_exists(p) for p in escaped)
    tree = [p.pid for p in run.alive()]
    assert len(tree) >= 8   # launcher, ps, 2 workers, 4 grandchildren
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=15) == 143, run.output
    assert any(line.startswith("[tfcluster] warning: got SIGTERM; stopping the cluster (each task has 30s to end "
                               "its step and save, --stop-grace") for line in run.lines), run.output
    # Including the grandchildren that left the worker's process group (start_new_session).
    assert no_process_left(tree + escaped, timeout=1)


def test_a_launcher_killed_outright_takes_its_tasks_with_it(procs, tmp_path):
    # SIGKILL leaves the launcher no chance to stop anything; the kernel does it
    # (PR_SET_PDEATHSIG). Grandchildren are the launcher's to stop while it lives.
    run = Run(procs, ["--ps", 0, "--workers", 2, "--"] + script("sleeper.py", "--no-tree"), tmp_path)
    run.wait_for(r"^\[worker:0\] ready$", 60)
    run.wait_for(r"^\[worker:1\] ready$", 60)
    tasks = run.pids("worker:0") + run.pids("worker:1")
    run.proc.send_signal(signal.SIGKILL)
    run.finish(timeout=15)
    left = not no_process_left(tasks, timeout=5)
    if left:
        for pid in tasks:  # nobody else would: their launcher is gone (and only now are the numbers theirs)
            kill_tree(pid)
    assert not left, "a task outlived its launcher's SIGKILL"


@pytest.mark.timeout(60)
def test_no_python_and_no_fork_handler_runs_in_a_task_between_the_launchers_fork_and_its_exec(tmp_path):
    # Python run there (a preexec_fn) ran gRPC's fork handlers too, which crashed a restarted worker with
    # SIGABRT before it exec'd (CI of 613deb6; grpc/grpc#43055; tfcluster/launch/exec_bound.py).
    marker = tmp_path / "forked"
    launcher = f"""
import os, sys
os.register_at_fork(after_in_child=lambda: open({str(marker)!r}, "a").write(f"{{os.getpid()}}\\n"))
from tfcluster.launch import LaunchConfig, LocalLauncher
result = LocalLauncher(LaunchConfig([sys.executable, "-c", "print('ran')"], ps=0, workers=2)).launch()
sys.exit(result.exit_code)
"""
    done = subprocess.run([PY, "-c", launcher], cwd=tmp_path, env=base_env(), capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("] ran") == 2, done.stdout
    assert not marker.exists(), f"Python ran in forked children {marker.read_text().split()} before exec"


def test_a_task_that_cannot_join_its_memory_cgroup_never_runs_but_says_why_in_one_line(tmp_path):
    missing = tmp_path / "no-such-cgroup" / "cgroup.procs"
    done = subprocess.run(bound_command([PY, "-c", "print('ran unlimited')"], os.environ, str(missing)),
                          capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"tfcluster: error: cannot join memory cgroup {missing.parent}: No such file or directory\n"


def test_a_command_that_cannot_be_run_is_named_before_anything_starts():
    with pytest.raises(FileNotFoundError):
        bound_command(["no-such-program-here"], os.environ)
    with pytest.raises(PermissionError):
        bound_command([os.path.abspath(__file__)], os.environ)     # not executable


def test_ctrl_c_on_the_launcher_stops_everything_and_exits_130(procs, tmp_path):
    run = Run(procs, ["--ps", 0, "--workers", 2, "--"] + script("sleeper.py"), tmp_path)
    run.wait_for(r"^\[worker:0\] ready$", 60)
    run.wait_for(r"^\[worker:1\] ready$", 60)
    tree = [p.pid for p in run.alive()]
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(timeout=15) == 130, run.output
    assert no_process_left(tree, timeout=1)


def test_timeout_stops_everything_and_exits_124_with_a_clear_line(procs, tmp_path):
    run = Run(procs, ["--ps", 0, "--workers", 1, "--timeout", 3, "--"] + script("sleeper.py"), tmp_path)
    assert run.finish(timeout=60) == 124, run.output
    assert "[tfcluster] error: timed out after 3s (--timeout); stopping the cluster" in run.lines
    assert run.alive() == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_max_restarts_brings_back_a_worker_killed_with_sigkill_on_its_port_and_the_run_completes(procs, tmp_path):
    run = Run(procs, ["--ps", 1, "--workers", 2, "--max-restarts", 1, "--timeout", 150, "--"]
              + script("counter.py", "--die-first-run", "worker:1"), tmp_path)
    run.wait_for(r"^\[worker:1\] ready to be killed$", 120)
    victim = run.pids("worker:1")[0]
    os.kill(victim, signal.SIGKILL)
    assert run.finish(timeout=150) == 0, run.output
    assert re.search(r"^\[tfcluster\] warning: worker:1 was killed by SIGKILL; restarting it \(restart 1 of 1",
                     run.output, re.M), run.output
    again = run.pids("worker:1")
    assert len(again) == 2 and again[0] == victim != again[1]
    # The restarted worker served on its old port and added its share to the ps's variable.
    assert "[worker:0] total 6" in run.lines and "[worker:1] total 6" in run.lines
    assert run.alive() == []


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_classic_tf1_script_runs_to_the_end_under_legacy_flags_and_the_launcher_ends_its_joined_ps(
        procs, tmp_path):
    # legacy_tf1.py knows nothing of tfcluster: flags in, its own Server, replica_device_setter,
    # MonitoredTrainingSession with StopAtStepHook, and server.join() on the ps. It runs with TF1
    # mode's session fixes: without them a non-chief sat out TF's 30 s "model not ready" poll
    # (pitfalls item 4), and then could wait forever for a chief that had finished.
    run = Run(procs, ["--ps", 1, "--workers", 2, "--legacy-flags", "--timeout", 170, "--"]
              + script("legacy_tf1.py", "--last_step", "50"), tmp_path)
    assert run.finish(timeout=180) == 0, run.output
    assert re.search(r"^\[tfcluster\] worker:1 started \(pid \d+\): \S+ -m tfcluster\.tf1 --session-fixes-only "
                     r"\S+legacy_tf1\.py --last_step 50 ", run.output, re.M), run.output
    assert "[ps:0] ps serving; join()" in run.lines
    for i in (0, 1):
        assert re.search(rf"^\[worker:{i}\] worker {i} done: ran \d+ steps, global step (\d+)", run.output, re.M)
    steps = [int(x) for x in re.findall(r"global step (\d+)", run.output)]
    # global_step fetched with train_op is read before that step's increment, and in async the two workers' last
    # steps may read it at once: the last steps ran at 48 and 49, or both at 48 (seen on CI), so 50 steps ran.
    assert len(steps) == 2 and max(steps) >= 50 - 2
    assert "[tfcluster] all 2 trainer(s) finished; stopping ps:0" in run.lines
    assert run.alive() == []


# ------------------------------------------------------------ who runs what
def _printed(run, task, key):
    line = run.wait_for(rf"^\[{re.escape(task)}\] {key} ", 1)
    return json.loads(line.split(" ", 2)[2])


def test_legacy_flags_reach_every_task_and_the_launcher_ends_a_ps_that_never_exits(procs, tmp_path):
    run = Run(procs, ["--ps", 1, "--workers", 2, "--legacy-flags", "--log-dir", tmp_path / "l", "--"]
              + script("roles.py"), tmp_path, ROLES_MARKS=str(tmp_path), ROLES_WAIT_FOR="ps-0")
    assert run.finish(timeout=60) == 0, run.output
    spec = json.loads((tmp_path / "l" / "cluster.json").read_text())
    hosts = [f"--ps_hosts={','.join(spec['ps'])}", f"--worker_hosts={','.join(spec['worker'])}"]
    assert _printed(run, "ps:0", "ARGV") == ["--job_name=ps", "--task_index=0"] + hosts
    assert _printed(run, "worker:1", "ARGV") == ["--job_name=worker", "--task_index=1"] + hosts
    assert _printed(run, "worker:1", "TF_CONFIG") == {"cluster": spec, "task": {"type": "worker", "index": 1}}
    assert "[ps:0] blocking forever" in run.lines
    assert "[tfcluster] all 2 trainer(s) finished; stopping ps:0" in run.lines
    for task in ("ps:0", "worker:0"):
        assert f"[{task}] REUSE 1 RESTART 0" in run.lines
    assert run.alive() == []


def test_a_cluster_file_with_a_master_and_a_job_of_no_role_starts_every_task_the_master_first(procs, tmp_path):
    # TF 1.x's ClusterSpec takes any job name: Estimator's "master", the tutorials' in-graph "local".
    p = procs.ports(4)
    spec = {"ps": [f"localhost:{p[0]}"], "master": [f"localhost:{p[1]}"], "worker": [f"localhost:{p[2]}"],
            "local": [f"localhost:{p[3]}"]}
    (tmp_path / "c.json").write_text(json.dumps(spec))
    run = Run(procs, ["--cluster", tmp_path / "c.json", "--"] + script("roles.py"), tmp_path)
    assert run.finish(timeout=60) == 0, run.output
    started = re.findall(r"^\[tfcluster\] (\S+) started \(pid", run.output, re.M)
    assert started == ["ps:0", "master:0", "worker:0", "local:0"]
    assert _printed(run, "local:0", "TF_CONFIG")["task"] == {"type": "local", "index": 0}
    assert "[tfcluster] done: 3 trainer(s) succeeded" in run.lines


def test_legacy_flags_run_a_python_script_with_the_session_fixes_unless_told_not_to(procs, tmp_path):
    fixed = Run(procs, ["--ps", 0, "--workers", 1, "--legacy-flags", "--"] + script("roles.py"), tmp_path)
    assert fixed.finish(timeout=60) == 0, fixed.output
    bare = Run(procs, ["--ps", 0, "--workers", 1, "--legacy-flags", "--no-session-fixes", "--"]
               + script("roles.py"), tmp_path)
    assert bare.finish(timeout=60) == 0, bare.output
    started = r"^\[tfcluster\] worker:0 started \(pid \d+\): \S+ "
    assert re.search(started + r"-m tfcluster\.tf1 --session-fixes-only \S+roles\.py --job_name", fixed.output, re.M)
    assert re.search(started + r"\S+roles\.py --job_name", bare.output, re.M), bare.output
    assert _printed(fixed, "worker:0", "ARGV")[:2] == _printed(bare, "worker:0", "ARGV")[:2] == [
        "--job_name=worker", "--task_index=0"]


def test_the_evaluator_is_outside_the_cluster_and_is_stopped_after_its_grace(procs, tmp_path):
    run = Run(procs, ["--ps", 0, "--workers", 1, "--chief", "--evaluator", "--evaluator-grace", 1,
                      "--legacy-flags=job-task", "--"] + script("roles.py"), tmp_path,
              ROLES_MARKS=str(tmp_path), ROLES_WAIT_FOR="evaluator-0")
    assert run.finish(timeout=60) == 0, run.output
    chief = _printed(run, "chief:0", "TF_CONFIG")
    evaluator = _printed(run, "evaluator:0", "TF_CONFIG")
    assert sorted(chief["cluster"]) == ["chief", "worker"] and chief["task"] == {"type": "chief", "index": 0}
    assert evaluator == {"cluster": chief["cluster"], "task": {"type": "evaluator", "index": 0}}
    assert _printed(run, "evaluator:0", "ARGV") == ["--job_name=evaluator", "--task_index=0"]
    assert "[evaluator:0] blocking forever" in run.lines
    assert "[tfcluster] the evaluator did not finish within 1s; stopping it" in run.lines
    assert run.alive() == []


def test_without_legacy_flags_the_command_gets_only_tf_config(procs, tmp_path):
    run = Run(procs, ["--ps", 0, "--workers", 2, "--"] + script("roles.py", "--mine"), tmp_path)
    assert run.finish(timeout=60) == 0, run.output
    assert _printed(run, "worker:0", "ARGV") == ["--mine"]
    assert _printed(run, "worker:1", "TF_CONFIG")["task"] == {"type": "worker", "index": 1}


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("args, message", [
    (["--workers", "0", "--", PY, "-c", "pass"], "--workers 0 leaves nobody to train"),
    (["--ps", "1"], "no command to run; give it after '--'"),
    (["--", "no-such-program-xyz", "train.py"], "cannot run 'no-such-program-xyz': not found on PATH"),
    (["--", "./missing/train.sh"], "cannot run './missing/train.sh': no such file"),
    (["--chief", "--legacy-flags", "--", PY, "-c", "pass"], "--legacy-flags=all has no chief host list"),
    (["--max-restarts", "-1", "--", PY, "-c", "pass"], "--max-restarts must be a whole number >= 0"),
    (["--timeout", "0", "--", PY, "-c", "pass"], "--timeout must be a positive number"),
    (["--workers", "two", "--", PY, "-c", "pass"], "argument --workers: 'two' is not a whole number"),
    (["--ps", "localhost:2222", "--", PY, "-c", "pass"], "'localhost:2222' is an address; here it takes a number"),
    (["--gpus-per-worker", "-1", "--", PY, "-c", "pass"], "--gpus-per-worker must be a whole number >= 0"),
    (["--threads-per-task", "-2", "--", PY, "-c", "pass"], "--threads-per-task must be a whole number >= 0"),
    (["--require-isolation", "--no-isolate", "--", PY, "-c", "pass"],
     "--require-isolation asks for the isolation that --no-isolate turns off; give one of them"),
    (["--require-isolation", "--host", "0.0.0.0", "--", PY, "-c", "pass"],
     "--require-isolation: the cluster cannot be isolated (0.0.0.0 is not a loopback address); nothing was "
     "started"),
    (["--workers", "1", "run.sh", "-v"], "'run.sh' is not an option, a script or python: put the command after "
                                         "'--' (... -- run.sh -v)"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(tmp_path, args, message):
    r = run_cli("local", *args, cwd=str(tmp_path))
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfcluster: error: ") and message in lines[0], r.stderr
    assert os.listdir(tmp_path) == []   # not even a log dir


def test_help_says_who_runs_what_and_lists_the_exit_codes():
    r = run_cli("local", "--help")
    assert r.returncode == 0
    for words in ("hosted by tfcluster itself", "with --legacy-flags the ps runs COMMAND too",
                  "124", "130/143", "--max-restarts K", "--evaluator-grace S"):
        assert words in r.stdout

