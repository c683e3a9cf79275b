"""Preemption loses nothing: SIGTERM ends the step in flight, writes a checkpoint, and a rerun resumes after it.

Schedulers stop jobs with SIGTERM and kill them a grace period later. Here a
real training run gets a real SIGTERM at a random step: one ``fit`` process,
an Estimator program, a Keras program on a cluster, and whole ``tfcluster
local`` clusters (async and sync), where the launcher forwards the signal to
every task at once, as a scheduler would. Each must
exit 143 with a line naming the step and the checkpoint, and a rerun on the
same checkpoint dir must start at the step after it: steps lost 0.
"""

import os
import random
import signal
import sys
import time

import pytest

from conftest import TFCLUSTER, no_process_left
from jobs.stream import Stream

HERE = os.path.dirname(os.path.abspath(__file__))
FIT_JOB = [sys.executable, os.path.join(HERE, "jobs", "fit_job.py")]
STEP = r"\[?(worker:\d|local)\]? .*step \d+ \(global (\d+)"
STOPPED = r"(\S+) stopped on SIGTERM after global step (\d+): saved model\.ckpt-(\d+) ([\d.]+)s after the signal"

# Not serial: every assertion is of steps and exit codes (the one bound, 30 s to exit, is 100x what it takes), so
# these run beside other tests and their seconds are figures of a shared machine, not bounds (tests/conftest.py).
pytestmark = pytest.mark.slow


def rng():
    return random.Random(os.environ.get("FAULT_SEED", "17"))


def global_steps(stream, after=0.0, before=float("inf")) -> list:
    """Every global step a trainer logged in the window."""
    return [int(m.group(2)) for _, m in stream.matches(STEP, after, before)]


# ====================================================================== one process
@pytest.mark.timeout(200)
def test_sigterm_to_a_fit_process_saves_the_step_it_ended_and_a_rerun_starts_at_the_next(procs, tmp_path,
                                                                                          reliability):
    ckpt = str(tmp_path / "ckpt")
    job = FIT_JOB + ["--mode", "local", "--step-sleep", "0.02", "--save-steps", "100000", "--ckpt", ckpt]
    at = rng().randint(20, 80)
    run = Stream(procs.start(job + ["--steps", "100000"]), "fit")
    run.wait_for(r"local step \d+ \(global (\d+)", 120, check=lambda m: int(m.group(1)) >= at)
    t_term = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    run.proc.send_signal(signal.SIGTERM)    # the same stop twice (Slurm's cgroup signal, then start's): one stop
    assert run.finish(timeout=60) == 143, run.tail()
    _, m = run.wait_for(STOPPED + r"; a restarted run resumes from it$", 1)
    stopped = int(m.group(2))
    assert int(m.group(3)) == stopped and max(global_steps(run)) == stopped
    # Not finished: no done marker for an evaluator to stop at.
    assert not os.path.exists(os.path.join(ckpt, "tfcluster_done.json"))

    again = Stream(procs.start(job + ["--steps", str(stopped + 5)]), "rerun")
    assert again.finish(timeout=120) == 0, again.tail()
    assert again.matches(rf"local restored the model from \S*model\.ckpt-{stopped} \(")
    assert min(global_steps(again)) == stopped + 1
    reliability(f"one process: steps lost to a SIGTERM at step {stopped}",
                max(global_steps(run)) - (min(global_steps(again)) - 1), "steps")
    reliability("one process: seconds from SIGTERM to the saved checkpoint", float(m.group(4)), "s")
    assert run.lines[-1][0] - t_term < 30


# ====================================================================== clusters
def launch(procs, tmp, mode, steps, *more):
    cmd = TFCLUSTER + ["local", "--ps", "1", "--workers", "2", "--log-dir", str(tmp / f"logs-{steps}"), "--",
                       *FIT_JOB, "--mode", mode, "--steps", str(steps), "--step-sleep", "0.02",
                       "--save-steps", "100000", "--ckpt", str(tmp / "ckpt"), *more]
    return Stream(procs.start(cmd, cwd=str(tmp)), f"tfcluster local ({mode})")


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.timeout(300)
def test_sigterm_to_tfcluster_local_reaches_every_task_the_chief_saves_and_a_rerun_loses_no_step(
        procs, tmp_path, reliability, mode):
    at = rng().randint(30, 90)
    run = launch(procs, tmp_path, mode, 100000)
    run.wait_for(r"\[worker:1\] .*step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= at)
    pids = [int(m.group(1)) for _, m in run.matches(r"started \(pid (\d+)\)")]
    t_term = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=90) == 143, run.tail(60)
    t_end = time.monotonic()
    if os.environ.get("SHOW"):
        print("\n".join(f"{t - t_term:6.2f} {line}" for t, line in run.lines if t > t_term - 0.5))
    _, m = run.wait_for(r"\[worker:0\] .*" + STOPPED, 1)
    saved = int(m.group(3))
    assert run.matches(r"\[worker:1\] .*worker:1 stopped on SIGTERM after global step \d+, [\d.]+s after the "
                       r"signal \(this task writes no checkpoint\)")
    assert run.matches(r"\[ps:0\] .*ps:0 got SIGTERM: serving on while a trainer still answers")
    assert no_process_left(pids, timeout=5)
    # Every step any worker took is in the checkpoint.
    assert max(global_steps(run)) <= saved, (max(global_steps(run)), saved)

    again = launch(procs, tmp_path, mode, saved + 10)
    assert again.finish(timeout=200) == 0, again.tail(60)
    assert again.matches(rf"\[worker:0\] .*restored the model from \S*model\.ckpt-{saved} \(")
    assert min(global_steps(again)) == saved + 1
    lost = max(global_steps(run)) - (min(global_steps(again)) - 1)
    reliability(f"{mode} cluster: steps lost to a SIGTERM to tfcluster local at step {saved}", lost, "steps")
    reliability(f"{mode} cluster: seconds from SIGTERM to the chief's saved checkpoint", float(m.group(4)), "s")
    reliability(f"{mode} cluster: seconds from SIGTERM to the launcher's exit", t_end - t_term, "s")


# ====================================================================== graph-mode tf.keras
@pytest.mark.timeout(300)
def test_sigterm_to_a_keras_program_on_a_cluster_ends_the_batch_the_chief_saves_and_its_run_id_resumes_it(
        procs, tmp_path, reliability):
    program = os.path.join(HERE, "programs", "keras_tutorial.py")

    def launch_keras(epochs, *more):
        cmd = TFCLUSTER + ["local", "--tf1", "--ps", "1", "--workers", "2", "--log-dir", str(tmp_path / f"l{epochs}"),
                           *more, "--", sys.executable, program, "--epochs", str(epochs)]
        return Stream(procs.start(cmd, cwd=str(tmp_path)), f"keras ({epochs} epochs)")
    run = launch_keras(200)
    _, started = run.wait_for(r"^\[tfcluster\] run: (\S+) ", 60)
    run.wait_for(r"\[worker:1\] .*Epoch (\d+)/200", 200, check=lambda m: int(m.group(1)) >= 2)
    t_term = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=90) == 143, run.tail(60)
    assert run.matches(rf"^\[tfcluster\] warning: got SIGTERM; .*--run-id {started.group(1)} resumes this run$")
    _, m = run.wait_for(r"\[worker:0\] .*worker:0 stopped on SIGTERM after global step (\d+): saved (model\.ckpt-\d+) "
                        r"([\d.]+)s after the signal", 1, after=t_term)
    assert run.matches(r"\[worker:1\] .*worker:1 stopped on SIGTERM after global step \d+, [\d.]+s after the signal "
                       r"\(this task writes no checkpoint\)", after=t_term)
    again = launch_keras(1, "--run-id", started.group(1))
    assert again.finish(timeout=200) == 0, again.tail(60)
    assert again.matches(rf"\[worker:0\] .*worker:0 restored the model from \S*/{m.group(2)} \(")
    # Another run of the same program starts afresh: its model has the same default name, not the same run.
    other = launch_keras(1)
    assert other.finish(timeout=200) == 0, other.tail(60)
    assert other.matches(r"\[worker:0\] .*worker:0 initialised the model")
    reliability("keras cluster: seconds from SIGTERM to the chief's saved checkpoint", float(m.group(3)), "s")


# ====================================================================== tf.estimator
@pytest.mark.timeout(240)
def test_sigterm_to_an_estimator_program_saves_the_step_it_ended_and_a_rerun_starts_at_the_next(procs, tmp_path,
                                                                                                 reliability):
    # The TF 1.x program of test_legacy_programs, unchanged, in one process: train_and_evaluate runs the loop
    # that fit runs, so a SIGTERM ends it the same way.
    program = [sys.executable, "-m", "tfcluster.tf1", os.path.join(HERE, "programs", "estimator_custom.py"),
               "--model_dir", str(tmp_path / "model")]
    run = Stream(procs.start(program + ["--max_steps", "100000000"], cwd=str(tmp_path)), "estimator")
    run.wait_for(r"global step (\d+)", 120, check=lambda m: int(m.group(1)) >= 100)
    time.sleep(rng().uniform(0.0, 1.0))
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=60) == 143, run.tail()
    _, m = run.wait_for(STOPPED + r"; a restarted run resumes from it$", 1)
    stopped = int(m.group(2))
    assert int(m.group(3)) == stopped

    again = Stream(procs.start(program + ["--max_steps", str(stopped + 5)], cwd=str(tmp_path)), "rerun")
    assert again.finish(timeout=120) == 0, again.tail()
    _, restored = again.wait_for(r"restored the model from \S*model\.ckpt-(\d+) \(", 1)
    assert again.matches(r"^STEPS \S+ 5$"), again.tail()     # steps stopped+1 .. stopped+5: none redone
    reliability(f"estimator: steps lost to a SIGTERM at step {stopped}", stopped - int(restored.group(1)), "steps")
    assert int(restored.group(1)) == stopped
    reliability("estimator: seconds from SIGTERM to the saved checkpoint", float(m.group(4)), "s")
