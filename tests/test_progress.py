"""Progress lines: the step target and an ETA when the loop has a target, readable times, no raw epoch seconds.

The hook is driven by hand with a clock of the test's own, so every figure on
its lines is known; the same hook runs in every training test of the suite.
"""

import logging
import re
import types

import pytest

from tfcluster.training import hooks
from tfcluster.graph.step import StepValues
from tfcluster.training.hooks import ProgressHook


class Clock:
    """Stands in for the ``time`` module inside tfcluster.training.hooks."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def time(self):
        return 1_795_000_000.0 + self.now


@pytest.fixture
def lines():
    """The tfcluster logger's lines at DEBUG, as a list."""
    log = logging.getLogger("tfcluster")
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append((record.levelname, record.getMessage()))
    handler = Keep()
    level = log.level
    log.setLevel(logging.DEBUG)     # setLevel, not the attribute: it clears the logger's cache
    log.addHandler(handler)
    yield got
    log.removeHandler(handler)
    log.setLevel(level)


def drive(monkeypatch, target, steps, every=10.0, step_secs=1.0, global_per_step=2):
    """Run a ProgressHook through ``steps`` steps of ``step_secs`` each; the cluster moves ``global_per_step``."""
    clock = Clock()
    monkeypatch.setattr(hooks, "time", clock)
    hook = ProgressHook("worker:0", every_secs=every, examples_per_step=32, started=clock.now - 2.5)
    hook.after_create_session(None, None)
    ctx = types.SimpleNamespace(last_step=target)
    for i in range(1, steps + 1):
        clock.now += step_secs
        hook.after_run(ctx, StepValues(None, None, None, i * global_per_step, 0.5))
    return hook


def test_a_progress_line_shows_how_far_the_global_step_is_and_when_it_should_end(monkeypatch, lines):
    drive(monkeypatch, target=600, steps=10)
    progress = [m for level, m in lines if " step 10 " in m]
    # Global step 20 of 600: 18 steps in the 9 s since the first step (global 2), so 580 more take 290 s.
    assert progress == ["worker:0 step 10 (global 20) 3% of 600, ETA 4:50 | loss 0.5000 | 1.0 steps/s 32 examples/s"]


def test_without_a_target_the_line_has_no_eta(monkeypatch, lines):
    drive(monkeypatch, target=float("inf"), steps=10)
    assert [m for _, m in lines if " step 10 " in m] == [
        "worker:0 step 10 (global 20) | loss 0.5000 | 1.0 steps/s 32 examples/s"]


def test_the_eta_reads_in_hours_when_it_is_long(monkeypatch, lines):
    drive(monkeypatch, target=100_000, steps=10)
    assert "0% of 100000, ETA 13:53:10 |" in next(m for _, m in lines if " step 10 " in m)


def test_the_lines_keep_the_format_tools_grep_for(monkeypatch, lines):
    drive(monkeypatch, target=600, steps=10)
    assert any(re.search(r"step \d+ \(global (\d+)\)", m) for _, m in lines)


def test_the_first_step_line_shows_seconds_and_keeps_the_epoch_time_for_tools_at_debug(monkeypatch, lines):
    hook = drive(monkeypatch, target=600, steps=1)
    info = [m for level, m in lines if level == "INFO"]
    debug = [m for level, m in lines if level == "DEBUG"]
    assert info == ["worker:0 first step done 3.5s after start, global step 2"]
    assert debug == [f"worker:0 first step done at t={hook.first_step_at:.3f}"]
    assert not any(re.search(r"t=\d{9,}", m) for m in info)
