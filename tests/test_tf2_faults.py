"""TF2 mode's faults: a trainer lost to the all-reduce group is named in one line within a bound, and a cluster
restarted with ``BackupAndRestore`` resumes at the epoch it was in.

- Two trainers started by hand with TF_CONFIG (as Slurm or Kubernetes start them), TF's multi-worker
  tutorial's fault-tolerant program: SIGKILL a worker, and the other exits 3 within TF's coordination
  heartbeat timeout (10 s) and slack, with one line naming the worker gone and no traceback; SIGKILL the
  chief (worker:0), and the other names it too.
- ``tfcluster local --tf2 --ps 0 --workers 2 --max-restarts 1``: a killed worker restarts every trainer (an
  all-reduce group takes no new member, docs/tf2.md "Faults"), ``BackupAndRestore`` resumes at the epoch the
  kill interrupted (epochs lost: 0, the figure in CI's log), and the run ends with exit 0.
- SIGTERM: every trainer ends at once (TF's coordination service would take the signal and train on); a
  program that saves at the signal (``BackupAndRestore(save_before_preemption=True)``, a custom loop with
  ``PreemptionCheckpointHandler``) saves at the step every trainer agrees on, and its rerun loses no step.
"""

import json
import os
import signal
import sys
import time

import pytest

from conftest import REPO, TFCLUSTER, base_env
from held_ports import REUSE
from jobs.stream import Stream
from tfcluster.tf2.faults import HEARTBEAT_TIMEOUT_SECS

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(REPO, "tests", "programs", "tf2_backup_fit.py")
LOST = (r"^tfcluster: error: worker:(\d): worker:(\d) (?:{how}): the all-reduce cannot go on without every "
        r"trainer, so worker:\d stops; tfcluster local --max-restarts restarts the trainers together")


def by_hand(procs, tmp, name):
    """Two TF2-mode trainers of PROGRAM on TF_CONFIG, each a Stream, training until killed."""
    cluster = {"worker": [f"localhost:{p}" for p in procs.ports(2)]}
    return [Stream(procs.start([sys.executable, "-m", "tfcluster.tf2", PROGRAM, "--backup", str(tmp / name),
                                "--epochs", "1000", "--batch-sleep", "0.05"],
                               env=base_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                                                  "task": {"type": "worker", "index": i}}),
                                            **REUSE)),
                   f"{name} worker:{i}") for i in range(2)]


@pytest.mark.serial         # the seconds from the kill to the survivor's line are bounded
@pytest.mark.timeout(240)
def test_a_killed_trainer_is_named_by_the_other_in_one_line_within_the_heartbeat_timeout(procs, tmp_path,
                                                                                          reliability):
    # Which of TF's two ways names the dead trainer first depends on the moment: its missed heartbeats, or a
    # collective call to it that finds its process gone; either line names it.
    how = (r"sent no heartbeat for 10s \(TF's coordination service\)"
           r"|closed its connection under a collective call \(its process is gone\)")
    for victim in (1, 0):
        w = by_hand(procs, tmp_path, f"kill-{victim}")
        for s in w:
            s.wait_for(r"^epoch 2 begins$", 150)
        t_kill = time.monotonic()
        os.kill(w[victim].proc.pid, signal.SIGKILL)
        survivor = w[1 - victim]
        assert survivor.finish(timeout=60) == 3, survivor.tail()      # exits.py: a peer lost
        t_said, m = survivor.wait_for(LOST.format(how=how), 1, after=t_kill)
        assert (int(m.group(1)), int(m.group(2))) == (1 - victim, victim)
        assert "Traceback" not in survivor.text, survivor.tail()
        reliability(f"TF2 mode: seconds from worker:{victim}'s kill to the other's line naming it",
                    t_said - t_kill, "s")
        assert t_said - t_kill < HEARTBEAT_TIMEOUT_SECS + 5


@pytest.mark.timeout(300)
def test_a_killed_worker_restarts_every_trainer_and_backup_and_restore_resumes_at_the_epoch_it_interrupted(
        procs, tmp_path, reliability):
    run = Stream(procs.start(TFCLUSTER + ["local", "--tf2", "--ps", "0", "--workers", "2", "--max-restarts", "1",
                                          "--log-dir", str(tmp_path / "logs"), "--", "python", PROGRAM, "--backup",
                                          str(tmp_path / "backup"), "--epochs", "6", "--batch-sleep", "0.05"],
                             cwd=str(tmp_path)), "tfcluster local --tf2")
    run.wait_for(r"^\[worker:1\] epoch 3 begins$", 150)
    pid = int(run.wait_for(r"^\[tfcluster\] worker:1 started \(pid (\d+)\)", 1)[1].group(1))
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert run.finish(timeout=200) == 0, run.tail(60)
    # Whichever the launcher reaps first starts the group restart: the killed worker:1, or worker:0, which names it
    # lost (exit 3) within 0.1 s of the kill (CI-42).
    assert run.matches(r"^\[tfcluster\] warning: (worker:1 was killed by SIGKILL|worker:0 exited with code 3 .*); "
                       r"its all-reduce group cannot take it back alone, so every trainer restarts \(restart 1 of 1"), \
        run.text[-6000:]
    assert run.matches(r"^\[tfcluster\] done: 2 trainer\(s\) succeeded; restarts: worker:0 1, worker:1 1$")
    # The epoch the kill interrupted: the trainers all-reduce every batch, so none ended it without worker:1.
    interrupted = 1 + max(int(m.group(1)) for _, m in run.matches(r"^\[worker:\d\] epoch (\d+) ends$", before=t_kill))
    resumed = []
    for task in ("worker:0", "worker:1"):
        t_restarted, _ = run.wait_for(rf"^\[tfcluster\] {task} restarted \(pid", 1, after=t_kill)
        resumed.append(int(run.wait_for(rf"^\[{task}\] epoch (\d+) begins$", 1, after=t_restarted)[1].group(1)))
        assert run.matches(rf"^\[{task}\] trained 6 epochs$", after=t_restarted)
    reliability("TF2 mode, BackupAndRestore: whole epochs redone after a worker's kill", interrupted - min(resumed),
                "epochs")
    assert resumed == [interrupted, interrupted], (interrupted, resumed)


@pytest.mark.timeout(300)
def test_sigterm_ends_every_trainer_at_once_and_a_rerun_resumes_at_the_epoch_it_interrupted(procs, tmp_path,
                                                                                          reliability):
    def launch(name, epochs):
        return Stream(procs.start(TFCLUSTER + ["local", "--tf2", "--ps", "0", "--workers", "2", "--log-dir",
                                               str(tmp_path / name), "--", "python", PROGRAM, "--backup",
                                               str(tmp_path / "backup"), "--epochs", str(epochs), "--batch-sleep",
                                               "0.05"], cwd=str(tmp_path)), name)
    run = launch("first", 100)
    run.wait_for(r"^\[worker:1\] batch 4 of epoch 2 ", 150)
    t_term = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=90) == 143, run.tail(60)
    t_end = time.monotonic()
    for i in range(2):         # TF's coordination service took SIGTERM and trained on until --stop-grace's SIGKILL
        assert run.matches(rf"^\[worker:{i}\] tfcluster: warning: worker:{i} stopped on SIGTERM: nothing saved "
                           r"\(Keras's BackupAndRestore resumes at the epoch in flight"), run.tail(60)
    interrupted = max(int(m.group(1)) for _, m in run.matches(r"^\[worker:\d\] epoch (\d+) begins$"))
    again = launch("again", interrupted + 1)
    assert again.finish(timeout=200) == 0, again.tail(60)
    resumed = min(int(m.group(1)) for _, m in again.matches(r"^\[worker:\d\] epoch (\d+) begins$"))
    reliability("TF2 mode: seconds from SIGTERM to the launcher's exit (--stop-grace 30)", t_end - t_term, "s")
    reliability("TF2 mode, BackupAndRestore: whole epochs redone after a SIGTERM", interrupted - resumed, "epochs")
    assert resumed == interrupted and t_end - t_term < 15


SAVES_AT_SIGTERM = {
    # program and its arguments, the line of a step done (its group: steps done so far), steps in an epoch
    "fit, BackupAndRestore(save_before_preemption=True)": (
        [PROGRAM, "--save-before-preemption", "--batch-sleep", "0.05", "--backup"],
        r"^\[worker:\d\] batch \d+ of epoch \d+ \(step (\d+)\)$", 10),
    "custom loop, PreemptionCheckpointHandler": (
        [os.path.join(REPO, "tests", "programs", "tf2_preemption_loop.py"), "--step-sleep", "0.05", "--ckpt"],
        r"^\[worker:\d\] step (\d+) done$", 20),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", sorted(SAVES_AT_SIGTERM))
def test_a_program_that_saves_at_sigterm_saves_at_the_step_every_trainer_agrees_on_and_a_rerun_loses_none(
        procs, tmp_path, reliability, shape):
    program, step_done, per_epoch = SAVES_AT_SIGTERM[shape]

    def launch(name, epochs):
        return Stream(procs.start(TFCLUSTER + ["local", "--tf2", "--ps", "0", "--workers", "2", "--log-dir",
                                               str(tmp_path / name), "--", "python"] + program +
                                  [str(tmp_path / "saved"), "--epochs", str(epochs)], cwd=str(tmp_path)), name)
    run = launch("first", 1000)
    run.wait_for(step_done.replace(r"(\d+)", str(per_epoch + 5)), 150)
    t_term = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=90) == 143, run.tail(60)
    t_end = time.monotonic()
    done = max(int(m.group(1)) for _, m in run.matches(step_done))
    again = launch("again", done // per_epoch + 2)
    assert again.finish(timeout=200) == 0, again.tail(60)
    restored = min(int(m.group(1)) for _, m in again.matches(step_done)) - 1
    for stream in (run, again):
        assert "Traceback" not in stream.text, stream.tail(60)
    reliability(f"TF2 mode, {shape}: steps lost at a SIGTERM", done - restored, "steps")
    reliability(f"TF2 mode, {shape}: seconds from SIGTERM to the launcher's exit", t_end - t_term, "s")
    assert restored == done and t_end - t_term < 15


def test_trainers_restart_together_in_tf2_mode_or_with_no_ps_except_in_the_shape_of_parameter_server_strategy():
    from tfcluster.launch.config import LaunchConfig
    tf2 = ("python", "-m", "tfcluster.tf2", PROGRAM)
    assert LaunchConfig(tf2, ps=0, workers=2).trainers_restart_together
    assert LaunchConfig(tf2, ps=1, workers=2).trainers_restart_together          # MirroredStrategy, the ps unused
    assert not LaunchConfig(tf2, chief=True, ps=1, workers=2).trainers_restart_together   # a coordinator's workers
    # Any mode: several trainers and no ps all-reduce as one group (Horovod, TF 1.x's collective strategies).
    assert LaunchConfig(("python", PROGRAM), ps=0, workers=2).trainers_restart_together
    assert not LaunchConfig(("python", PROGRAM), ps=0, workers=1).trainers_restart_together
    assert not LaunchConfig(("python", PROGRAM), ps=1, workers=2).trainers_restart_together
