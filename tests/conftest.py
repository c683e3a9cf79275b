"""Shared fixtures: real processes, reserved ports, and a guarantee of no orphans."""

import collections
import logging
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tfcluster.topology.ports import pick_free_ports

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_env(**extra):
    """The environment a test's child process gets: quiet TF, tfcluster importable."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["GRPC_VERBOSITY"] = "NONE"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


TFCLUSTER = [sys.executable, "-m", "tfcluster"]


def run_cli(*args, timeout=60, env=None, **kw):
    """Run ``tfcluster ARGS`` to completion and return the CompletedProcess (text)."""
    return subprocess.run(TFCLUSTER + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=env or base_env(), **kw)


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """The small classification data set of tests/_fit_job.py, written once per test run."""
    import _fit_job as job
    return job.make_data(str(tmp_path_factory.mktemp("data") / "data.npz"))


def run_local(tmp_path, *args, timeout=240):
    """``tfcluster local ARGS`` to completion in ``tmp_path``; returns (exit code, combined output).

    Every task process the launcher reported must be gone when it returns.
    """
    r = run_cli("local", "--log-dir", tmp_path / "logs", *args, timeout=timeout, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    started = [int(m) for m in re.findall(r"started \(pid (\d+)\)", out)]
    assert no_process_left(started), "a task process outlived the launcher"
    return r.returncode, out


def kill_tree(pid, sig=signal.SIGKILL):
    """Kill a process and every descendant of it (each by PID, never by name)."""
    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=5)


class Procs:
    """Starts child processes for a test and, whatever happens, leaves none behind."""

    def __init__(self):
        self.started = []

    def start(self, cmd, env=None, **kw):
        """Popen ``cmd`` in its own session with pipes; remembered for cleanup."""
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.STDOUT)
        p = subprocess.Popen([str(c) for c in cmd], env=env or base_env(), text=True,
                             start_new_session=True, **kw)
        self.started.append(p)
        return p

    def cli(self, *args, **kw):
        """Start ``tfcluster ARGS`` in the background."""
        return self.start(TFCLUSTER + list(args), **kw)

    def descendants(self):
        """Every live process started by this test, children included."""
        out = []
        for p in self.started:
            try:
                root = psutil.Process(p.pid)
                out += [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        return [q for q in out if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]

    def cleanup(self):
        for p in self.started:
            kill_tree(p.pid)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()


@pytest.fixture
def said(caplog):
    """tfcluster's log lines during the test (its logger may not propagate: the CLI's setup turns that off)."""
    log = logging.getLogger("tfcluster")
    level, own = log.level, not log.propagate
    if own:
        log.addHandler(caplog.handler)
    log.setLevel(logging.INFO)
    yield caplog
    if own:
        log.removeHandler(caplog.handler)
    log.setLevel(level)


@pytest.fixture
def procs():
    """Start real processes; every one (and its children) is killed at teardown."""
    p = Procs()
    yield p
    p.cleanup()


@pytest.fixture
def ports():
    """A function that returns n distinct free ports on localhost."""
    return lambda n: pick_free_ports(n)


def wait_until(predicate, timeout, what):
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def no_process_left(pids, timeout=5.0):
    """True once none of ``pids`` is alive (zombies count as gone)."""
    def gone():
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                pass
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone():
            return True
        time.sleep(0.05)
    return gone()


# ------------------------------------------------------------------ reliability figures
#: (test, figure, value, unit) recorded by the fault tests, printed in one table at the end of the run.
FIGURES = []


def record_figure(test: str, figure: str, value, unit: str = ""):
    """Note a fault test's figure (steps lost, seconds to detect, ...) for the reliability table."""
    FIGURES.append((test, figure, value, unit))


@pytest.fixture
def reliability(request):
    """``reliability(figure, value, unit)``: this test's figure, for the table CI's log shows."""
    return lambda figure, value, unit="": record_figure(request.node.name, figure, value, unit)


#: Seconds of setup, call and teardown per test file, for the table of where the run's time goes.
FILE_SECONDS = collections.Counter()


def pytest_runtest_logreport(report):
    """Add each phase's duration to its test file's total."""
    FILE_SECONDS[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    """The seconds each test file took (CI's time budget is spent where this says), then the reliability
    table: every fault test's figures, after the test run (so CI's log has them)."""
    tr = terminalreporter
    if FILE_SECONDS:
        total = sum(FILE_SECONDS.values())
        tr.write_sep("=", f"seconds per test file ({total:.0f} s in all)")
        for path, secs in FILE_SECONDS.most_common():
            tr.write_line(f"{secs:8.1f} s {100 * secs / total:5.1f} %  {path}")
    if not FIGURES:
        return
    tr.write_sep("=", "reliability figures (fault tests)")
    width = max(len(f) for _, f, *_ in FIGURES)
    shown_test = None
    for test, figure, value, unit in FIGURES:
        if test != shown_test:
            tr.write_line(test)
            shown_test = test
        shown = f"{value:.1f}" if isinstance(value, float) else str(value)
        tr.write_line(f"  {figure:<{width}}  {shown} {unit}".rstrip())
