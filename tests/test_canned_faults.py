"""A canned estimator on a cluster under faults: a killed ps resumes from the last checkpoint, a SIGTERM loses no step.

The wide & deep model of tests/programs/canned.py (a DNNLinearCombinedClassifier over feature columns, TF 1.x's
own class), unchanged under ``tfcluster local --tf1 --ps 1 --workers 2 --max-restarts 1``; every step's global
step is logged (``log_step_count_steps=1``) so the tests read what was lost off the tasks' logs.
"""

import os
import random
import signal
import sys
import time

import pytest

from conftest import TFCLUSTER, no_process_left
from jobs.stream import Stream

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "canned.py")
STEP = r"\[(worker:\d)\] .*loss = [-\d.e+]+, step = (\d+)"      # the Estimator's step log: the global step
SAVED = r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)"

# Not serial: it asserts steps saved, lost and resumed, and bounds no seconds (tests/conftest.py).
pytestmark = pytest.mark.slow


def launch(procs, tmp, max_steps, logs):
    cmd = TFCLUSTER + ["local", "--tf1", "--ps", "1", "--workers", "2", "--max-restarts", "1", "--timeout", "240",
                       "--log-dir", str(tmp / logs), "--", sys.executable, PROGRAM, "--model_dir", str(tmp / "model"),
                       "--estimator", "DNNLinearCombinedClassifier", "--max_steps", str(max_steps), "--log_steps", "1"]
    return Stream(procs.start(cmd, cwd=str(tmp)), f"wide & deep ({logs})")


def global_steps(stream, after=0.0, before=float("inf")):
    return [int(m.group(2)) for _, m in stream.matches(STEP, after, before)]


@pytest.mark.timeout(300)
def test_a_canned_model_outlives_a_killed_ps_and_a_sigterm_then_resumes_at_the_step_it_saved(procs, tmp_path,
                                                                                              reliability):
    rng = random.Random(os.environ.get("FAULT_SEED", "22"))
    run = launch(procs, tmp_path, 10 ** 8, "first")
    # ---- the ps SIGKILLed between two saves (every 100 steps), both workers training
    _, m = run.wait_for(SAVED, 150, check=lambda m: int(m.group(1)) >= 100)
    saved = int(m.group(1))
    run.wait_for(STEP, 60, check=lambda m: int(m.group(2)) >= saved + rng.randint(10, 80))
    ps_pid = int(run.wait_for(r"^\[tfcluster\] ps:0 started \(pid (\d+)\)", 1)[1].group(1))
    t_kill = time.monotonic()
    os.kill(ps_pid, signal.SIGKILL)
    time.sleep(0.5)      # lines still arriving for a moment are of steps before the kill
    at_kill = max(global_steps(run, before=t_kill + 0.5))
    last_save = [int(m.group(1)) for _, m in run.matches(SAVED, before=t_kill)][-1]
    t_lost, _ = run.wait_for(r"\[worker:\d\] .*lost its session", 30, after=t_kill)
    t_restored, m = run.wait_for(r"\[worker:0\] .*worker:0 restored the model from \S*model\.ckpt-(\d+) "
                                 r"\(global step (\d+),", 120, after=t_kill)
    # The checkpoint named by the step the chief read before saving holds the updates that landed meanwhile.
    assert int(m.group(1)) == last_save and last_save <= int(m.group(2)) <= at_kill, m.group(0)
    restored = int(m.group(2))
    # Each worker's first step after it lost its session (worker:1 may step before the chief's line arrives).
    firsts = []
    for task in ("worker:0", "worker:1"):
        t_task, _ = run.wait_for(rf"\[{task}\] .*{task} lost its session", 30, after=t_kill)
        firsts.append(int(run.wait_for(STEP.replace(r"worker:\d", task), 60, after=t_task)[1].group(2)))
    resumed = min(firsts)
    reliability(f"wide & deep: steps lost to a ps kill at step {at_kill} (saves every 100)", at_kill - restored, "steps")
    reliability("wide & deep: seconds from the ps kill to a worker's lost-session line", t_lost - t_kill, "s")
    reliability("wide & deep: seconds from the ps kill to the restore", t_restored - t_kill, "s")
    assert restored < resumed <= restored + 2, (restored, resumed)      # both workers may step on it at once

    # ---- then SIGTERM to the launcher, as a scheduler stops a job: the chief saves the step it ended
    run.wait_for(STEP, 60, after=t_restored, check=lambda m: int(m.group(2)) >= last_save + rng.randint(20, 60))
    pids = [int(m.group(1)) for _, m in run.matches(r"started \(pid (\d+)\)")]
    t_term = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=90) == 143, run.tail(60)
    _, m = run.wait_for(r"\[worker:0\] .*worker:0 stopped on SIGTERM after global step (\d+): saved "
                        r"model\.ckpt-(\d+) ([\d.]+)s after the signal", 1, after=t_term)
    stopped = int(m.group(2))
    assert max(global_steps(run)) <= stopped       # every step any worker took is in that checkpoint
    assert no_process_left(pids, timeout=5)

    again = launch(procs, tmp_path, stopped + 10, "again")
    assert again.finish(timeout=200) == 0, again.tail(60)
    assert again.matches(rf"\[worker:0\] .*restored the model from \S*model\.ckpt-{stopped} \(")
    # The rerun's first steps follow the saved one (two at once, when both workers step on it together: CI-20).
    assert stopped < min(global_steps(again)) <= stopped + 2, (stopped, global_steps(again)[:4])
    lost = max(global_steps(run)) - stopped
    reliability(f"wide & deep: steps lost to a SIGTERM at step {stopped}", lost, "steps")
    reliability("wide & deep: seconds from SIGTERM to the chief's saved checkpoint", float(m.group(3)), "s")
