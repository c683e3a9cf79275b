"""Shared fixtures: real processes, reserved ports, and a guarantee of no orphans."""

import collections
import fcntl
import json
import logging
import numbers
import os
import pathlib
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from held_ports import HeldPorts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The suite compares distributed training with one process to 1e-5: its tasks and this process do float32 math
#: (bfloat16 math, on by default where the CPU has it, rounds matrix products to 3 digits). The tests of bfloat16
#: math ask for it themselves (tests/test_precision.py).
os.environ["TFCLUSTER_MATH"] = "float32"


def on_ci() -> bool:
    """True on CI (``CI`` set to 1, true or yes, as .ci/run and CI services set it), where a test that cannot run
    is a failure, not a skip: the suite's one CI check."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def need_root(why: str) -> None:
    """Skip the calling test without root, saying ``why``; on CI, which runs as root, fail instead."""
    if os.geteuid() != 0:
        if on_ci():
            pytest.fail(f"this test needs root ({why}); CI must run it as root")
        pytest.skip(f"needs root ({why})")


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


def run_local(tmp_path, *args, timeout=240, env=None):
    """``tfcluster local ARGS`` to completion in ``tmp_path`` (in ``env``, else base_env()); returns (exit code,
    combined output).

    Every task process the launcher reported must be gone when it returns.
    """
    r = run_cli("local", "--log-dir", tmp_path / "logs", *args, timeout=timeout, env=env, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    started = [int(m) for m in re.findall(r"started \(pid (\d+)\)", out)]
    assert no_process_left(started), "a task process outlived the launcher"
    return r.returncode, out


def live_process(pid):
    """psutil's Process for ``pid`` while a process has that number, else None.

    This machine has 32768 pids (/proc/sys/kernel/pid_max) and each TensorFlow process starts dozens of threads,
    so the number of a task that has ended soon names a thread of another process (psutil takes a thread id for a
    process, and a signal to it ends that whole process: in CI it was the suite's fork server, tests/forks.py).
    Zombies count as gone.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            tgid = next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
        proc = psutil.Process(pid)
        return proc if tgid == pid and proc.status() != psutil.STATUS_ZOMBIE else None
    except (OSError, StopIteration, psutil.NoSuchProcess):
        return None


def kill_tree(pid, sig=signal.SIGKILL):
    """Kill a live process and every descendant of it (each by PID, never by name).

    Only for a process known to be alive (unreaped, or seen in this test's output and not yet reported gone): an
    ended one's number may be another's by now.
    """
    root = live_process(pid)
    if root is None:
        return
    try:
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
    """Starts child processes for a test and, whatever happens, leaves none behind; :attr:`ports` gives ports
    held until a child's server answers on them (tests/held_ports.py: children need ``held_ports.REUSE``)."""

    def __init__(self):
        self.started = []
        self.ports = HeldPorts()

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
            root = live_process(p.pid) if p.returncode is None else None   # reaped: the number is not ours
            try:
                out += [root] + root.children(recursive=True) if root else []
            except psutil.NoSuchProcess:
                pass
        return [q for q in out if q.is_running() and q.status() != psutil.STATUS_ZOMBIE]

    def cleanup(self):
        self.ports.release()
        for p in self.started:
            if p.returncode is None:        # not reaped yet, so the number is still this process's
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
    """``ports(n)``: n distinct free ports on localhost, each held until a server answers on it (its child needs
    ``held_ports.REUSE`` in its environment), the rest until the test ends (tests/held_ports.py)."""
    held = HeldPorts()
    yield held
    held.release()


def data_files(checkpoint_dir, step=None) -> list:
    """The data file names of the checkpoint at ``step`` in ``checkpoint_dir`` (its latest by default): one per
    device that saved it (``-00000-of-00002`` ...), so their count says whether the save was sharded."""
    import glob
    prefix = (os.path.join(str(checkpoint_dir), f"model.ckpt-{step}") if step is not None
              else max(glob.glob(os.path.join(str(checkpoint_dir), "model.ckpt-*.index")),
                       key=lambda p: int(p.rsplit("-", 1)[1].split(".")[0]))[:-len(".index")])
    return sorted(os.path.basename(p) for p in glob.glob(glob.escape(prefix) + ".data-*"))


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
        return all(live_process(pid) is None for pid in pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone():
            return True
        time.sleep(0.05)
    return gone()


# ------------------------------------------------------------------ tests side by side
# pytest.ini runs the suite in two xdist workers, a test file to a worker (its module fixtures start once).
# A test marked ``serial`` measures seconds against a bound (a fault's detection, a bound a user is promised) or
# asserts a step never waited a second: serial tests run one at a time with nothing beside them, each file's back to
# back (a worker keeps the lock from one serial test to the next of the same file). A readers-writer lock every test
# holds shared and a serial test alone, with a turnstile that lets a waiting serial test in before the next shared
# holder, so it never starves. Tests in network namespaces are not serial: each makes namespaces of its own
# (tests/netns.py, a prefix of its own), Slurm's daemons are one file's (tests/test_slurm.py), and what they time
# has bounds loose enough for a busy machine; their few tight ones are marked serial there. Fault tests that assert
# steps saved, lost and resumed, and report seconds only as figures (test_preemption, test_canned_faults,
# test_faults' async run), run beside other tests too: their figures are a shared machine's, their assertions hold
# on any.
# Files with serial tests are handed out first (pytest.ini's --no-loadscope-reorder keeps this order): both workers
# start on them, so one file's serial run follows another's with no wait for a test of the other worker to end, and
# the run ends on tests that share the machine, not on one worker's serial file with the other idle.
#: How long a test waits for the lock: longer than any one test file's serial tests run (test_faults_users_hit's
#: ~215 s in CI, the longest) plus one test of the other worker (pytest.ini's timeouts).
LOCK_WAIT_SECS = 900
#: This worker's exclusive hold, kept from a serial test to the next when it is the same file's.
_KEPT = None


def pytest_configure(config):
    """The controller of a parallel run makes the folder its workers' lock files live in."""
    if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None) \
            and not hasattr(config, "workerinput"):
        config.lock_dir = tempfile.mkdtemp(prefix="tfcluster-tests-")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Each xdist worker is told where the run's lock files are."""
    node.workerinput["lock_dir"] = node.config.lock_dir


def pytest_unconfigure(config):
    """The controller removes the lock files when the run ends."""
    if getattr(config, "lock_dir", None):
        shutil.rmtree(config.lock_dir, ignore_errors=True)


def _flock(path, mode, what):
    """Open ``path`` and take ``fcntl.flock(mode)`` on it within LOCK_WAIT_SECS; the open file holds it."""
    f = open(path, "a")
    deadline = time.monotonic() + LOCK_WAIT_SECS
    while True:
        try:
            fcntl.flock(f, mode | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                pytest.fail(f"waited {LOCK_WAIT_SECS} s for {what}", pytrace=False)
            time.sleep(0.05)


def _serial(item):
    return item is not None and item.get_closest_marker("serial") is not None


@pytest.hookimpl(wrapper=True, tryfirst=True)    # outermost: the wait is not part of the test's timeout
def pytest_runtest_protocol(item, nextitem):
    """Run the test under the run's lock: a serial test alone, any other beside any other but a serial one."""
    global _KEPT
    workerinput = getattr(item.config, "workerinput", {})
    if "lock_dir" not in workerinput:
        return (yield)
    root = pathlib.Path(workerinput["lock_dir"])
    serial = _serial(item)
    if _KEPT is not None:                 # the previous test was this file's serial test, and so is this one
        held, _KEPT = _KEPT, None
    else:
        turnstile = _flock(root / "serial.turnstile", fcntl.LOCK_EX, "the other worker's serial test")
        try:
            held = _flock(root / "serial.lock", fcntl.LOCK_EX if serial else fcntl.LOCK_SH,
                          "the other worker's test to end" if serial else "the other worker's serial test")
        finally:
            turnstile.close()
    try:
        return (yield)
    finally:
        # xdist's worker knows its next test before it runs this one, so nextitem is the one that follows.
        if serial and _serial(nextitem) and nextitem.path == item.path:
            _KEPT = held
        else:
            held.close()


#: Seconds per test file in a CI run (its log's "seconds per test file" table), for the order files are handed out
#: in: the longest first, so the run ends on short files side by side, not on one long file with the other worker
#: idle (CI-37: 1465 s of wall for 2520 test-seconds). A stale figure only costs time; a new file counts as the median.
FILE_SECONDS_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_seconds.json")


def _recorded_seconds() -> dict:
    try:
        with open(FILE_SECONDS_JSON, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def pytest_collection_modifyitems(items):
    """Files with a serial test first, then the longest files first (FILE_SECONDS_JSON), each file's tests in their
    own order (see "tests side by side")."""
    serial_files = {item.path for item in items if _serial(item)}
    recorded = _recorded_seconds()
    median = statistics.median(recorded.values()) if recorded else 0.0

    def seconds(item):
        return recorded.get(item.nodeid.split("::", 1)[0], median)
    items.sort(key=lambda item: (item.path not in serial_files, -seconds(item)))     # sort is stable


# ------------------------------------------------------------------ reliability figures
#: (test, figure, value, unit) of the fault tests, printed in one table at the end of the run. Figures travel
#: in each report's user_properties, so under xdist the controller, which prints the table, has them too.
FIGURES = []


def _plain(value):
    """A figure as a built-in type: xdist's channel carries no numpy scalars."""
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) else str(value)


@pytest.fixture
def reliability(request):
    """``reliability(figure, value, unit)``: this test's figure, for the table CI's log shows."""
    def record(figure, value, unit=""):
        request.node.user_properties.append(("figure", (figure, _plain(value), unit)))
    return record


#: Seconds of setup, call and teardown per test file, for the table of where the run's time goes.
FILE_SECONDS = collections.Counter()


def pytest_runtest_logreport(report):
    """Add each phase's duration to its test file's total; take a finished test's figures."""
    FILE_SECONDS[report.nodeid.split("::", 1)[0]] += report.duration
    if report.when == "teardown":       # every phase's report carries them all: take them once
        test = report.nodeid.rsplit("::", 1)[-1]
        FIGURES.extend((test, *figure) for key, figure in report.user_properties if key == "figure")


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
