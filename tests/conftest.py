"""Shared fixtures: real processes, reserved ports, and a guarantee of no orphans."""

import fcntl
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


#: The name a figure travels under in a test report (from a pytest-xdist worker to the table).
FIGURE_PROPERTY = "tfcluster_figure"


@pytest.fixture
def reliability(request):
    """``reliability(figure, value, unit)``: this test's figure, for the table CI's log shows."""
    return lambda figure, value, unit="": request.node.user_properties.append(
        (FIGURE_PROPERTY, (figure, value, unit)))


def pytest_runtest_logreport(report):
    """Collect each test's figures where the table is printed (in the one process that reports, xdist or not)."""
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == FIGURE_PROPERTY:
            record_figure(report.nodeid.split("::")[-1], *value)


def pytest_terminal_summary(terminalreporter):
    """The reliability table: every fault test's figures, after the test run (so CI's log has them)."""
    if not FIGURES:
        return
    tr = terminalreporter
    tr.write_sep("=", "reliability figures (fault tests)")
    width = max(len(f) for _, f, *_ in FIGURES)
    shown_test = None
    for test, figure, value, unit in FIGURES:
        if test != shown_test:
            tr.write_line(test)
            shown_test = test
        shown = f"{value:.1f}" if isinstance(value, float) else str(value)
        tr.write_line(f"  {figure:<{width}}  {shown} {unit}".rstrip())


# ------------------------------------------------------------------ tests side by side (pytest-xdist)
#: Modules whose tests have the machine to themselves (marked ``alone``), and why. Every other test runs
#: beside one other (pytest.ini: -n 2, a file per worker, so a module's fixtures are made once).
ALONE = {
    # Their figures are seconds (to detect a loss, to stop, to restart) and steps lost: what an idle
    # machine measures, the figures CI's reliability table reports.
    "test_faults": "timed faults", "test_faults_keras": "timed faults", "test_faults_users_hit": "timed faults",
    "test_canned_faults": "timed faults", "test_preemption": "timed stops",
    "test_checkpoint_restarts": "timed restarts",
    # Each bad input must end inside its bound in seconds (20 s for most), TF's imports included.
    "test_bad_input": "timed bounds",
    # A memory cgroup's peak is read against a bound; another cluster's pages would crowd the machine's.
    "test_memory_limits": "memory bounds",
}


def pytest_configure(config):
    """The ``alone`` marker (tests that may not share the machine with another test)."""
    config.addinivalue_line("markers", "alone: runs while no other test runs (timed faults, memory bounds, "
                                       "network namespaces: tests/conftest.py ALONE)")


def pytest_collection_modifyitems(items):
    """Mark ``alone`` every test of :data:`ALONE`'s modules and of a module with a network-namespace test: its
    hosts live in its module fixtures, on one subnet (tests/netns.py)."""
    netns = {item.module.__name__ for item in items if item.get_closest_marker("netns") is not None}
    for item in items:
        if item.module.__name__ in ALONE or item.module.__name__ in netns:
            item.add_marker(pytest.mark.alone)


class Turns:
    """Whose turn it is among pytest-xdist's workers: tests share the machine; an ``alone`` test has it alone.

    A readers-writer lock on two files all workers open: every test holds the room shared, an ``alone``
    test holds it exclusively. Each first passes the gate, which an ``alone`` test keeps while it waits for
    the room to empty, so the other worker's tests cannot keep it out for ever.
    """

    def __init__(self, folder: str):
        self.kept = False       # the room is held on, alone, for the next test of the same module
        self.gate = open(os.path.join(folder, "gate"), "a+")
        self.room = open(os.path.join(folder, "room"), "a+")

    def enter(self, alone: bool):
        """Wait for the room: shared, or alone."""
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    def leave(self):
        """Give the room back."""
        fcntl.flock(self.room, fcntl.LOCK_UN)


_turns = []
#: The key of the turns' folder in an xdist worker's input.
TURNS = "tfcluster_turns"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)   # outside pytest-timeout's: a wait for a turn is no hang
def pytest_runtest_protocol(item, nextitem):
    """Run each test in its turn under pytest-xdist; an ``alone`` module keeps the machine from its first
    test to its last, so its module fixtures (clusters, hosts) never meet another test's."""
    worker = getattr(item.config, "workerinput", None)     # a pytest run started by a test has none
    if worker is None:
        yield
        return
    if not _turns:
        _turns.append(Turns(worker[TURNS]))
    turns = _turns[0]
    alone = item.get_closest_marker("alone") is not None
    if not turns.kept:
        turns.enter(alone)
    try:
        yield
    finally:
        turns.kept = alone and nextitem is not None and nextitem.module is item.module \
            and nextitem.get_closest_marker("alone") is not None
        if not turns.kept:
            turns.leave()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """The controller tells each xdist worker where the turns' files are (one folder per run)."""
    config = node.config
    if not hasattr(config, "_tfcluster_turns"):
        import tempfile
        config._tfcluster_turns = tempfile.mkdtemp(prefix="tfcluster-test-turns-")
    node.workerinput[TURNS] = config._tfcluster_turns


def pytest_unconfigure(config):
    """The controller of an xdist run removes the turns' files once its workers are gone."""
    folder = getattr(config, "_tfcluster_turns", None)
    if folder:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)
