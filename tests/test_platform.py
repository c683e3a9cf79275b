"""Where a POSIX feature is missing, tfcluster still imports and runs, and says in one line what is off.

This machine is Linux with every feature, so their absence is simulated: the
probes of :mod:`tfcluster.core.posix` switched off in-process, and, for the import,
a child Python whose ``signal`` module has no SIGHUP before tfcluster loads.
The Linux path itself is what every other launcher test runs.
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import base_env
from tfcluster.core import posix
from tfcluster.launch import LaunchConfig, LocalLauncher

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


class Lines:
    """A LineWriter stand-in that keeps the launcher's lines."""

    def __init__(self):
        self.lines = []

    def line(self, text):
        self.lines.append(text.rstrip("\n"))


def test_on_linux_every_feature_is_there():
    assert sys.platform.startswith("linux")
    assert posix.prctl() is not None and posix.unshare() is not None
    assert posix.stop_signals() == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    assert posix.missing_features() == []


@pytest.fixture
def launcher_lines(monkeypatch):
    """The ``tfcluster`` logger sent to a list of lines for one test, as the CLI sends it to stdout."""
    import logging
    from tfcluster.core.logs import use_prefixed_logging
    log = logging.getLogger("tfcluster")
    saved = log.handlers[:], log.level, log.propagate
    out = Lines()
    use_prefixed_logging(out)
    yield out
    log.handlers[:], log.level, log.propagate = saved


def test_without_prctl_and_sighup_the_launcher_runs_its_tasks_and_says_what_is_off(monkeypatch, tmp_path,
                                                                                    launcher_lines):
    monkeypatch.setattr(posix, "prctl", lambda: None)
    monkeypatch.setattr(posix, "hangup_signal", lambda: None)
    monkeypatch.chdir(tmp_path)
    out = launcher_lines
    config = LaunchConfig([sys.executable, os.path.join(SCRIPTS, "roles.py")], ps=0, workers=2, isolate=False,
                          subreaper=True)
    assert LocalLauncher(config, writer=out).run() == 0
    platform = [line for line in out.lines if line.startswith("[tfcluster] platform: ")]
    assert platform == [
        "[tfcluster] platform: no prctl() here: a task outlives a launcher killed by SIGKILL, and orphans of a "
        "task are found only by walking process trees (Ctrl-C and SIGTERM still stop everything)",
        "[tfcluster] platform: no SIGHUP here: closing the terminal does not stop tasks cleanly (Ctrl-C and "
        "SIGTERM do)"]
    assert any(line.startswith("[worker:1] TF_CONFIG ") for line in out.lines)
    assert out.lines[-1] == "[tfcluster] done: 2 trainer(s) succeeded"


def test_without_network_namespaces_isolation_is_off_with_the_reason(monkeypatch):
    from tfcluster.launch.isolation import isolate_launch
    monkeypatch.setattr(posix, "unshare", lambda: None)
    isolated, line = isolate_launch(LaunchConfig([sys.executable, "-c", "pass"], isolate=True))
    assert not isolated
    assert line.startswith("isolation: off (no network namespaces here (no unshare() in the C library)): ")


# A child Python on a system without SIGHUP and without prctl: it imports the CLI and runs both commands
# that use signals (a local cluster, and one task with tfcluster start).
NO_POSIX_EXTRAS = textwrap.dedent("""
    import signal, sys
    del signal.SIGHUP
    import tfcluster.core.posix as posix
    posix.prctl = lambda: None
    from tfcluster.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("argv, says", [
    (["local", "--ps", "0", "--workers", "1", "--no-isolate"], "[tfcluster] platform: no SIGHUP here"),
    (["start", "--worker", "localhost:1", "--job", "worker", "--task", "0"], "tfcluster: platform: no SIGHUP here"),
], ids=["local", "start"])
def test_the_cli_imports_and_runs_where_there_is_no_sighup(tmp_path, argv, says):
    r = subprocess.run([sys.executable, "-c", NO_POSIX_EXTRAS, *argv, "--", sys.executable, "-c", "print('ran')"],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path), env=base_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert "ran" in r.stdout
    assert sum(says in line for line in (r.stdout + r.stderr).splitlines()) == 1


def test_signals_taken_are_given_back_as_they_were_and_a_thread_takes_none():
    before = {s: signal.getsignal(s) for s in posix.stop_signals()}
    seen = []
    previous = posix.take_signals(lambda signum, _frame: seen.append(signum))
    try:
        assert set(previous) == set(posix.stop_signals())
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        posix.give_back_signals(previous)
    assert {s: signal.getsignal(s) for s in posix.stop_signals()} == before

    import threading
    taken = []
    thread = threading.Thread(target=lambda: taken.append(posix.take_signals(lambda *_: None)))
    thread.start()
    thread.join(5)
    assert taken == [{}]      # Python installs handlers in the main thread only: the caller stops by other means
