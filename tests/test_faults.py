"""Faults, for real: SIGKILL a worker, the ps, a worker of a sync run, a save in progress.

Every fault here is a real ``kill -9`` of a real training process; the tests
read what survived and what was lost off the tasks' own logs (every step is
logged with its global step, every checkpoint with its step) and off the
checkpoint directory.

- A worker killed in an async run: the others go on; under ``--max-restarts``
  it comes back, rejoins, and the run reaches its step target.
- The ps killed: the workers say so at once, wait for it (bounded, saying
  what they wait for), and resume from the last checkpoint once the launcher
  has restarted it; the steps lost are those since that checkpoint.
- A worker killed in a sync run: with a backup (replicas_to_aggregate <
  workers) training goes on; without one, the survivor names the missing
  worker within seconds and gives up with SyncStallError instead of hanging
  (pitfalls item 5).
- Kills inside a save (the moment one starts) and at random moments: the latest
  complete checkpoint always restores, and training goes on from it.

test_ps_training.py has the sync runs whose killed worker or chief is
restarted by hand; test_local.py a restart of a non-training task.
"""

import json
import os
import random
import re
import shutil
import signal
import sys
import time

import pytest

from conftest import TFCLUSTER, Procs, base_env, no_process_left
from held_ports import REUSE
from jobs.stream import Stream

HERE = os.path.dirname(os.path.abspath(__file__))
FIT_JOB = [sys.executable, os.path.join(HERE, "jobs", "fit_job.py")]
STEP = r"\[(worker:\d)\] .*step \d+ \(global (\d+)\)"     # a launcher line of fit's per-step log

pytestmark = pytest.mark.slow
#: A fault whose detection is bounded in seconds, or a sync step that must never wait a second: alone on the
#: machine (tests/conftest.py). The async run and the kills during saves assert steps and checkpoints only.
timed = pytest.mark.serial


def global_steps(stream, after=0.0, before=float("inf"), pattern=STEP):
    """[(time, task, global step)] of every step line in the window."""
    return [(t, m.group(1), int(m.group(2))) for t, m in stream.matches(pattern, after, before)]


def last_global(stream, before=float("inf")):
    steps = global_steps(stream, before=before)
    return max(g for _, _, g in steps) if steps else -1


def wait_global(stream, at_least, timeout, task="worker:0"):
    """Wait until ``task`` logs a global step >= at_least; return (time, step)."""
    t, m = stream.wait_for(rf"\[{task}\] .*step \d+ \(global (\d+)\)", timeout,
                           check=lambda m: int(m.group(1)) >= at_least)
    return t, int(m.group(1))


def read_marker(ckpt):
    with open(os.path.join(ckpt, "tfcluster_done.json"), encoding="utf-8") as f:
        return json.load(f)


def tfcluster_pids(stream, task):
    """The pids the launcher announced for ``task``, in start order."""
    return [int(m.group(1)) for _, m in stream.matches(rf"^\[tfcluster\] {re.escape(task)} (?:re)?started \(pid (\d+)\)")]


# ==================================================== async: a worker, then the ps
STEPS, SAVE, SLEEP = 300, 25, 0.1


@pytest.fixture(scope="module")
def async_faults(tmp_path_factory):
    """One async run under ``tfcluster local --max-restarts 1``: worker:1 is killed, then the ps.

    The facts each test needs are recorded in ``run.facts`` as the faults happen.
    """
    procs = Procs()
    tmp = tmp_path_factory.mktemp("async_faults")
    ckpt = str(tmp / "ckpt")
    cmd = TFCLUSTER + ["local", "--ps", "1", "--workers", "2", "--max-restarts", "1", "--timeout", "280",
                       "--log-dir", str(tmp / "logs"), "--"] + FIT_JOB + [
        "--mode", "async", "--steps", str(STEPS), "--ckpt", ckpt, "--save-steps", str(SAVE),
        "--step-sleep", str(SLEEP), "--startup-timeout", "90"]
    run = Stream(procs.start(cmd, cwd=str(tmp)), "tfcluster local")
    run.ckpt, run.facts = ckpt, {}
    f = run.facts
    try:
        # ---- fault 1: SIGKILL worker:1 once training runs
        wait_global(run, 40, 150)
        victim = tfcluster_pids(run, "worker:1")[0]
        f["w1_kill_t"] = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        f["w1_kill_step"] = last_global(run, before=f["w1_kill_t"])
        f["w1_back_t"], _ = run.wait_for(r"\[worker:1\] .*worker:1 found the model ready", 120, after=f["w1_kill_t"])
        f["w1_rejoin_t"], m = run.wait_for(r"\[worker:1\] .*step \d+ \(global (\d+)\)", 60, after=f["w1_back_t"])
        f["w1_rejoin_step"] = int(m.group(1))

        # ---- fault 2: SIGKILL the ps at a random point of a checkpoint interval, both workers training
        t_both, _ = wait_global(run, f["w1_rejoin_step"] + 20, 60)
        t_save, m = run.wait_for(r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)", 60, after=t_both)
        saved = int(m.group(1))
        target = saved + random.Random(os.environ.get("FAULT_SEED", "6")).randint(3, SAVE * 4 // 5)
        wait_global(run, target, 60)
        ps_pid = tfcluster_pids(run, "ps:0")[0]
        f["ps_kill_t"] = time.monotonic()
        os.kill(ps_pid, signal.SIGKILL)
        # No step can finish once the ps is gone; lines still arriving for a moment are of steps before it.
        time.sleep(0.5)
        f["ps_kill_step"] = last_global(run, before=f["ps_kill_t"] + 0.5)
        saves = [int(m.group(1)) for _, m in run.matches(r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)",
                                                          before=f["ps_kill_t"])]
        f["last_save_before_ps_kill"] = saves[-1]
        run.code = run.finish(timeout=240)
    finally:
        run.pids = [int(m.group(1)) for _, m in run.matches(r"started \(pid (\d+)\)")]
        procs.cleanup()
    return run


@pytest.mark.timeout(330)
def test_the_async_run_survives_a_killed_worker_and_a_killed_ps_and_reaches_its_step_target(async_faults):
    run = async_faults
    assert run.code == 0, run.tail(60)
    marker = read_marker(run.ckpt)
    assert STEPS <= marker["global_step"] <= STEPS + 2, marker
    assert os.path.exists(os.path.join(run.ckpt, os.path.basename(marker["checkpoint"]) + ".index"))
    # The closing line counts the launcher's restarts of the killed ps and worker.
    assert run.matches(r"^\[tfcluster\] done: 2 trainer\(s\) succeeded; restarts: ps:0 1, worker:1 1$"), run.tail(5)
    assert no_process_left(run.pids, timeout=10)


def test_while_worker_1_is_dead_worker_0_goes_on_training(async_faults, reliability):
    f = async_faults.facts
    # (lines of the moment of the kill may still be arriving for half a second)
    alone = global_steps(async_faults, f["w1_kill_t"] + 0.5, f["w1_back_t"])
    assert {task for _, task, _ in alone} == {"worker:0"}, "only worker:0 steps while worker:1 is dead"
    done_alone = max(g for *_, g in alone) - f["w1_kill_step"]
    dead_for = f["w1_back_t"] - f["w1_kill_t"]
    reliability("async: seconds worker:1 was dead (launcher restart)", dead_for, "s")
    reliability("async: global steps worker:0 took alone meanwhile", done_alone, "steps")
    assert done_alone >= 10


def test_the_killed_worker_is_restarted_and_rejoins_the_run_where_it_stands(async_faults):
    f = async_faults.facts
    assert async_faults.matches(r"^\[tfcluster\] warning: worker:1 was killed by SIGKILL; restarting it "
                                r"\(restart 1 of 1, same TF_CONFIG and port\)$")
    assert async_faults.matches(r"^\[worker:1\] pid \d+ restart 1$")
    # It joined the model as it stands (the chief did not restore: nothing was rolled back).
    assert f["w1_rejoin_step"] > f["w1_kill_step"]
    assert not async_faults.matches(r"worker:0 restored the model", f["w1_kill_t"], f["ps_kill_t"])
    after = global_steps(async_faults, f["w1_rejoin_t"], f["ps_kill_t"])
    assert sum(1 for _, task, _ in after if task == "worker:1") >= 3


def test_the_workers_notice_a_killed_ps_at_once_and_say_so(async_faults, reliability):
    f = async_faults.facts
    for task in ("worker:0", "worker:1"):
        t, m = async_faults.wait_for(rf"\[{task}\] .*warning: {task} lost its session \((\w+Error): "
                                     r"(/job:ps/replica:0/task:0: .*)\); recreating it", 1, after=f["ps_kill_t"])
        reliability(f"async: seconds from the ps kill to {task}'s {m.group(1)} line", t - f["ps_kill_t"], "s")
        assert t - f["ps_kill_t"] < 15
    assert async_faults.matches(r"^\[tfcluster\] warning: ps:0 was killed by SIGKILL; restarting it "
                                r"\(restart 1 of 1", after=f["ps_kill_t"])


def test_after_the_ps_restart_the_run_resumes_from_the_last_checkpoint_losing_only_the_steps_since(async_faults,
                                                                                                   reliability):
    f = async_faults.facts
    run = async_faults
    t_restored, m = run.wait_for(r"\[worker:0\] .*worker:0 restored the model from \S*model\.ckpt-(\d+) "
                                 r"\(global step (\d+)", 1, after=f["ps_kill_t"])
    restored, held = int(m.group(1)), int(m.group(2))
    assert restored == f["last_save_before_ps_kill"]
    # Each worker's first step after it lost its session: worker:1 may step on the restored model before the
    # chief's line saying it restored it reaches the log (the chief still runs its local init meanwhile).
    firsts = []
    for task in ("worker:0", "worker:1"):
        t_lost, _ = run.wait_for(rf"\[{task}\] .*{task} lost its session", 1, after=f["ps_kill_t"])
        firsts.append(next(g for _, who, g in global_steps(run, after=t_lost) if who == task))
    resumed = min(firsts)
    lost = f["ps_kill_step"] - (resumed - 1)
    waited = t_restored - f["ps_kill_t"]
    reliability(f"async: global steps lost to the ps kill (save interval {SAVE})", lost, "steps")
    reliability("async: seconds from the ps kill to the restore", waited, "s")
    # Async, two workers: the other worker's updates land while the chief saves, so model.ckpt-N holds a global
    # step past N, as many as the save took (CI saw 4, and 16 with the machine's cores shared): the chief's restore
    # line says which, and the first steps follow it (two at once when both workers step on it together).
    window = [line for t, line in run.lines if t_restored - 5 <= t <= t_restored + 5
              and re.search(r"global|restored|lost its session|recreat", line)]
    assert restored <= held < resumed <= held + 2, "\n".join(window)
    assert 0 <= lost <= SAVE


# ======================================================= sync with a dead worker
class HandCluster:
    """1 ps (``tfcluster start``) + 2 workers (``python fit_job.py`` with TF_CONFIG), started by hand."""

    def __init__(self, procs, tmp, *job_args):
        p = procs.ports(3)
        self.cluster = {"worker": [f"localhost:{p[0]}", f"localhost:{p[1]}"], "ps": [f"localhost:{p[2]}"]}
        spec = tmp / "cluster.json"
        spec.write_text(json.dumps(self.cluster))
        self.ckpt = str(tmp / "ckpt")
        self.ps = Stream(procs.start(TFCLUSTER + ["start", "--cluster", spec, "--job", "ps", "--task", "0"],
                                     env=base_env(**REUSE)), "ps")
        self.w = [Stream(procs.start(FIT_JOB + ["--ckpt", self.ckpt, *job_args],
                                     env=base_env(TF_CONFIG=json.dumps({"cluster": self.cluster, "task": {
                                         "type": "worker", "index": i}}), **REUSE)), f"worker:{i}")
                  for i in range(2)]


BY_HAND_STEP = r"step \d+ \(global (\d+)\)"


@timed
@pytest.mark.timeout(240)
def test_a_sync_run_with_a_backup_worker_trains_on_to_its_target_when_a_worker_is_killed(procs, tmp_path,
                                                                                           reliability):
    steps = 150
    c = HandCluster(procs, tmp_path, "--mode", "sync", "--replicas", "1", "--steps", str(steps), "--step-sleep",
                    "0.05", "--save-steps", "50", "--stall-warn", "1")
    c.w[1].wait_for(r"worker:1 .*step \d+ \(global (?:[3-9]\d|\d{3,})\)", 150)
    t_kill = time.monotonic()
    os.kill(c.w[1].proc.pid, signal.SIGKILL)
    at_kill = max(int(m.group(1)) for _, m in c.w[0].matches(BY_HAND_STEP, before=t_kill))
    assert c.w[0].finish(timeout=120) == 0, c.w[0].tail()
    after = [int(m.group(1)) for _, m in c.w[0].matches(BY_HAND_STEP, after=t_kill)]
    assert read_marker(c.ckpt)["global_step"] == steps
    # The chief never waited for the dead worker: a backup does not hold a step up.
    assert not c.w[0].matches(r"has waited", after=t_kill)
    # Its final save waited for the dead worker's end only until the global step had stood still for 5 s.
    assert c.w[0].matches(r"worker:0 saves without the 1 trainer\(s\) still in their training \(the global step "
                          r"has not moved for 5s\)", after=t_kill)
    reliability("sync with a backup: global steps worker:0 took alone after the kill", max(after) - at_kill,
                "steps")
    # The ps still waits for worker:1's done token (a dead trainer never gives it): stop it as a launcher would.
    assert c.ps.proc.poll() is None
    c.ps.proc.send_signal(signal.SIGTERM)
    assert c.ps.finish(timeout=30) == 0


@timed
@pytest.mark.timeout(240)
def test_a_sync_run_without_a_backup_names_the_killed_worker_and_gives_up_instead_of_hanging(procs, tmp_path,
                                                                                               reliability):
    c = HandCluster(procs, tmp_path, "--mode", "sync", "--steps", "100000", "--step-sleep", "0.05",
                    "--save-steps", "50", "--stall-warn", "1", "--stall-timeout", "6")
    c.w[1].wait_for(r"worker:1 .*step \d+ \(global (?:[2-9]\d|\d{3,})\)", 150)
    t_kill = time.monotonic()
    os.kill(c.w[1].proc.pid, signal.SIGKILL)
    t_warn, m = c.w[0].wait_for(r"worker:0 has waited (\d+)s on sync step (\d+): 1 of 2 gradient\(s\) in "
                                r"\(worker:0\); not yet from worker:1 \(last step (\d+)\)", 30, after=t_kill)
    assert int(m.group(3)) == int(m.group(2)) - 1      # worker:1 pushed the step before, then died
    code = c.w[0].finish(timeout=60)
    t_end = time.monotonic()
    assert code == 3                                   # exits.py: a peer unreachable
    t_err, e = c.w[0].wait_for(r"fit_job: error: sync step stalled for (\d+)s \(stall_timeout_secs=6\): "
                               r"1 of 2 gradient\(s\) in \(worker:0\); not yet from worker:1 \(last step \d+\)", 1)
    reliability("sync, no backup: seconds from the kill to the chief naming worker:1", t_warn - t_kill, "s")
    reliability("sync, no backup: seconds from the kill to giving up (stall_timeout_secs=6)", t_err - t_kill, "s")
    assert t_warn - t_kill < 10
    assert 6 <= int(e.group(1)) and t_end - t_kill < 30


@timed
@pytest.mark.timeout(240)
def test_a_stopped_worker_under_sync_replicas_optimizer_is_named_within_the_stall_period_then_given_up_on(
        procs, tmp_path, reliability):
    """An unchanged TF 1.x script: MonitoredTrainingSession, SyncReplicasOptimizer and its hook, TF1 mode.

    TensorFlow's waits there (a worker's token, the chief's take_grad) had no
    timeout: a worker that stopped answering froze the others for ever, silently.
    """
    script = os.path.join(HERE, "legacy", "sync_replicas_loop.py")
    run = Stream(procs.start(TFCLUSTER + ["local", "--tf1", "--ps", "1", "--workers", "1", "--chief",
                                          "--stop-grace", "2", "--log-dir", str(tmp_path / "logs"), "--timeout",
                                          "200", "--", "python", script, "--steps", "1000000", "--step-sleep", "0.05"],
                             env=base_env(TFCLUSTER_SYNC_STALL_SECS="2", TFCLUSTER_SYNC_TIMEOUT_SECS="8"),
                             cwd=str(tmp_path)), "tfcluster local")
    run.wait_for(r"\[worker:0\] worker:0 step (?:[2-9]\d|\d{3,})$", 150)
    victim = tfcluster_pids(run, "worker:0")[0]
    t_stop = time.monotonic()
    os.kill(victim, signal.SIGSTOP)         # a hung host: the process is there, and answers nothing
    t_warn, m = run.wait_for(r"\[chief:0\] .*chief:0 has waited (\d+)s on sync step (\d+): 1 of 2 gradient\(s\) "
                             r"in \(chief:0\); not yet from worker:0 \(last step (\d+)\)", 30, after=t_stop)
    assert int(m.group(3)) == int(m.group(2)) - 1       # worker:0 pushed the step before, then stopped
    t_err, e = run.wait_for(r"\[chief:0\] .*error: sync step stalled for (\d+)s \(stall_timeout_secs=8\): "
                            r"1 of 2 gradient\(s\) in \(chief:0\); not yet from worker:0", 60, after=t_warn)
    assert run.finish(timeout=60) == 3                 # the chief's exit: a peer lost (exits.py)
    reliability("SyncReplicasOptimizer, a stopped worker: seconds to the chief naming it", t_warn - t_stop, "s")
    reliability("SyncReplicasOptimizer, a stopped worker: seconds to giving up (timeout 8 s)", t_err - t_stop, "s")
    assert t_warn - t_stop < 10 and 8 <= int(e.group(1)) and t_err - t_stop < 30


# ================================================== kill during a checkpoint save
KILLS = 3


@pytest.mark.timeout(300)
def test_kills_during_saves_always_leave_a_latest_checkpoint_that_restores(procs, tmp_path, reliability):
    """A model with a 32 MB variable, saved after every step, so most of the time is spent saving.

    Kills alternate: one the moment a save starts (its debug line is out, its
    "saved" line is not: the kill lands inside the save), one at a random moment.
    Each run after a kill must restore the latest checkpoint in full (every
    variable) and train on from its step; the last one then runs to its end.
    """
    rng = random.Random(os.environ.get("FAULT_SEED", "4"))
    ckpt = str(tmp_path / "ckpt")
    job = FIT_JOB + ["--mode", "local", "--ckpt", ckpt, "--save-steps", "1", "--ballast-mb", "32", "--keep", "2"]
    latest, inside = None, 0
    for i in range(KILLS + 1):
        final = i == KILLS
        run = Stream(procs.start(job + ["--steps", str(latest + 3) if final else "1000000"],
                                 env=base_env(TFCLUSTER_DEBUG="1")), f"run {i}")
        if latest is not None:
            _, m = run.wait_for(r"local restored the model from \S*model\.ckpt-(\d+) \(", 120)
            # The newest checkpoint on disk, unless the run said it cannot be read (a kill inside its index).
            unreadable = {int(n.group(1)) for _, n in run.matches(r"checkpoint \S*model\.ckpt-(\d+) cannot be read")}
            assert int(m.group(1)) == max(set(on_disk) - unreadable), (on_disk, unreadable, m.group(0))
            latest = int(m.group(1))
            run.wait_for(rf"local first step done .* global step {latest + 1}\b", 60)
        if final:
            assert run.finish(timeout=60) == 0, run.tail()
            break
        t_saved, _ = run.wait_for(r"local saved checkpoint model\.ckpt-(\d+)", 120)
        if i % 2 == 0:
            _, m = run.wait_for(r"local saving checkpoint model\.ckpt-(\d+)", 60, after=t_saved)
            mid = int(m.group(1))
        else:
            time.sleep(rng.uniform(0.0, 1.0))
            mid = None
        os.kill(run.proc.pid, signal.SIGKILL)
        run.finish(timeout=30)
        saved = [int(m.group(1)) for _, m in run.matches(r"local saved checkpoint model\.ckpt-(\d+)")]
        # The newest checkpoint on disk is the last save that finished, or one killed after its files were
        # written and before its "saved" line or TF's record of it: the next run restores that one.
        on_disk = [int(n.group(1)) for n in map(re.compile(r"model\.ckpt-(\d+)\.index$").match, os.listdir(ckpt))
                   if n]
        latest = max(on_disk)
        assert saved[-1] <= latest <= saved[-1] + 1, (saved[-3:], latest)
        if mid is not None:
            inside += mid not in saved          # the log proves it: the save began and never finished
    assert inside >= 1, "no kill landed inside a save: the test did not test what it claims"
    reliability(f"kills during saves that landed inside one (of {KILLS}); every one restored", inside, "")
    shutil.rmtree(ckpt)   # a few hundred MB of ballast


# ==================================================== async with increments: the ps killed between full saves
@pytest.mark.timeout(300)
def test_after_a_ps_restart_the_chief_restores_the_last_increment_losing_only_the_steps_since_it(procs, tmp_path,
                                                                                                reliability):
    # Full checkpoints every 50 steps, increments (an embedding variable's rows written since the last save, the
    # rest of the model whole) every 5: the ps dies 25-40 steps past a full save, and the restore is the full one
    # plus its increments (docs/embeddings.md, "Incremental saves").
    full, every = 50, 5
    ckpt = str(tmp_path / "ckpt")
    cmd = TFCLUSTER + ["local", "--ps", "1", "--workers", "1", "--max-restarts", "1", "--timeout", "240",
                       "--log-dir", str(tmp_path / "logs"), "--"] + FIT_JOB + [
        "--mode", "async", "--steps", "150", "--ckpt", ckpt, "--save-steps", str(full), "--increment-steps",
        str(every), "--step-sleep", "0.05", "--startup-timeout", "90"]
    run = Stream(procs.start(cmd, cwd=str(tmp_path)), "tfcluster local")
    _, m = run.wait_for(r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)", 150,
                        check=lambda m: int(m.group(1)) >= full)
    saved = int(m.group(1))
    wait_global(run, saved + random.Random(os.environ.get("FAULT_SEED", "6")).randint(25, 40), 60)
    kill_t = time.monotonic()
    os.kill(tfcluster_pids(run, "ps:0")[0], signal.SIGKILL)
    time.sleep(0.5)
    at_kill = last_global(run, before=kill_t + 0.5)
    _, m = run.wait_for(r"\[worker:0\] .*applied (\d+) increment\(s\) after model\.ckpt-(\d+), up to global step "
                        r"(\d+)", 120, after=kill_t)
    applied, base, restored = int(m.group(1)), int(m.group(2)), int(m.group(3))
    assert run.finish(timeout=200) == 0, "\n".join(line for _, line in run.lines[-40:])
    lost = at_kill - restored
    reliability(f"async: global steps lost to the ps kill with increments every {every} steps (full saves every "
                f"{full})", lost, "steps")
    assert base == saved and applied >= 4 and 0 <= lost <= 2 * every, (applied, base, restored, at_kill)
    assert read_marker(ckpt)["global_step"] >= 150
