"""Faults under graph-mode tf.keras on a cluster, for real: the faults fit's rows cover, ending the same way.

Keras's ``fit`` runs on the same training session, loop and hooks as ``fit`` and the Estimator, so each
fault of the reliability table ends the same way for it. Each fault is a real kill or stop of a process
running ``tfcluster.keras.fit`` (tests/jobs/keras_job.py, which logs every batch with the update count on
the ps):

- a worker killed: the other trains on; restarted, it rejoins the model as it stands;
- the ps killed: the workers say so at once; the chief restores the last checkpoint into the restarted ps,
  and the updates lost are those since it;
- the ps killed while the chief waits at its fit's end for the other's: it recovers and the run ends whole;
- the chief gone for good: the worker names it within ``chief_timeout_secs`` and stops (exit 3), and the
  ps still exits;
- the ps stopped (SIGSTOP, a hung host): the workers name it after ``step_timeout_secs`` and go on once it
  answers, nothing rolled back.

Every figure goes to the reliability table printed at the end of the test run.
"""

import json
import os
import re
import signal
import sys
import time

import pytest

from conftest import TFCLUSTER, Procs, base_env, no_process_left
from held_ports import REUSE
from jobs.stream import Stream

HERE = os.path.dirname(os.path.abspath(__file__))
KERAS_JOB = [sys.executable, os.path.join(HERE, "jobs", "keras_job.py")]
BATCH = r"\[(worker:\d)\] worker:\d batch \d+ \(updates (\d+)\)"     # a launcher line of the job's batch log

pytestmark = [pytest.mark.slow, pytest.mark.serial]     # serial: a fault's detection is measured in seconds


def updates(stream, task=None, after=0.0, before=float("inf"), pattern=BATCH):
    """[(time, task, update count)] of the batch lines in the window (of ``task`` only, if given)."""
    return [(t, m.group(1), int(m.group(2))) for t, m in stream.matches(pattern, after, before)
            if task is None or m.group(1) == task]


def wait_updates(stream, at_least, timeout, task="worker:0", after=0.0):
    """Wait until ``task`` logs a batch with at least ``at_least`` updates on the ps; return (time, count)."""
    t, m = stream.wait_for(rf"^(?:\[{task}\] )?{task} batch \d+ \(updates (\d+)\)", timeout, after=after,
                           check=lambda m: int(m.group(1)) >= at_least)
    return t, int(m.group(1))


def launched_pid(stream, task, nth=0):
    return [int(m.group(1)) for _, m in stream.matches(rf"^\[tfcluster\] {re.escape(task)} (?:re)?started "
                                                      r"\(pid (\d+)\)")][nth]


def keras_local(procs, tmp, *launcher, job=()):
    """``tfcluster local`` of keras_job, as a Stream (every line timed as it arrives)."""
    cmd = TFCLUSTER + ["local", "--ps", "1", "--workers", "2", "--log-dir", str(tmp / "logs"), *launcher,
                       "--"] + KERAS_JOB + list(job)
    return Stream(procs.start(cmd, cwd=str(tmp)), "tfcluster local")


# ========================================================= a worker, then the ps
@pytest.fixture(scope="module")
def keras_faults(tmp_path_factory):
    """One async Keras run under ``tfcluster local --max-restarts 1``: worker:1 is killed, then the ps."""
    procs = Procs()
    tmp = tmp_path_factory.mktemp("keras_faults")
    until = tmp / "stop"        # made once the run showed what the tests read: it trains as long as that takes
    run = keras_local(procs, tmp, "--max-restarts", "1", "--timeout", "280",
                      job=["--epochs", "1000", "--until", str(until), "--step-sleep", "0.05", "--save-secs", "1",
                           "--ckpt", str(tmp / "ckpt")])
    f = run.facts = {}
    try:
        wait_updates(run, 40, 150)
        f["w1_kill_t"] = time.monotonic()
        os.kill(launched_pid(run, "worker:1"), signal.SIGKILL)
        f["w1_kill_updates"] = max(n for *_, n in updates(run, before=f["w1_kill_t"]))
        f["w1_back_t"], _ = run.wait_for(r"\[worker:1\] .*worker:1 found the model ready", 120, after=f["w1_kill_t"])
        f["w1_rejoin_t"], m = run.wait_for(r"\[worker:1\] worker:1 batch \d+ \(updates (\d+)\)", 60,
                                           after=f["w1_back_t"])
        f["w1_rejoin_updates"] = int(m.group(1))

        t_both, _ = wait_updates(run, f["w1_rejoin_updates"] + 20, 60)
        run.wait_for(r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)", 60, after=t_both)
        time.sleep(0.4)            # into the next checkpoint period: some updates are not saved yet
        f["ps_kill_t"] = time.monotonic()
        os.kill(launched_pid(run, "ps:0"), signal.SIGKILL)
        time.sleep(0.5)            # lines of the batches before the kill may still be arriving
        f["ps_kill_updates"] = max(n for *_, n in updates(run, before=f["ps_kill_t"] + 0.5))
        f["saves_before_ps_kill"] = [int(m.group(1)) for _, m in run.matches(
            r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)", before=f["ps_kill_t"])]
        t_restored, _ = run.wait_for(r"\[worker:0\] .*worker:0 restored the model from ", 120, after=f["ps_kill_t"])
        for task in ("worker:0", "worker:1"):      # both train on the restored ps before the run ends
            wait_updates(run, 0, 120, task=task, after=t_restored)
        until.touch()
        run.code = run.finish(timeout=120)
    finally:
        run.pids = [int(m.group(1)) for _, m in run.matches(r"started \(pid (\d+)\)")]
        procs.cleanup()
    return run


@pytest.mark.timeout(330)
def test_a_keras_run_survives_a_killed_worker_and_a_killed_ps_and_every_task_ends(keras_faults):
    run = keras_faults
    assert run.code == 0, run.tail(60)
    # The closing line counts the launcher's restarts of the killed ps and worker.
    assert run.matches(r"^\[tfcluster\] done: 2 trainer\(s\) succeeded; restarts: ps:0 1, worker:1 1$"), run.tail(5)
    assert no_process_left(run.pids, timeout=10)
    ends = [int(m.group(1)) for _, m in run.matches(r"\] worker:\d ends with updates (\d+)$")]
    assert len(ends) == 2 and ends[0] == ends[1]      # both programs' models end with the one update count


def test_while_a_keras_worker_is_dead_the_other_trains_on(keras_faults, reliability):
    f = keras_faults.facts
    alone = updates(keras_faults, after=f["w1_kill_t"] + 0.5, before=f["w1_back_t"])
    assert {task for _, task, _ in alone} == {"worker:0"}
    done_alone = max(n for *_, n in alone) - f["w1_kill_updates"]
    reliability("keras: seconds worker:1 was dead (launcher restart)", f["w1_back_t"] - f["w1_kill_t"], "s")
    reliability("keras: updates worker:0 made alone meanwhile", done_alone, "updates")
    assert done_alone >= 10


def test_the_killed_keras_worker_rejoins_the_model_as_it_stands(keras_faults):
    f = keras_faults.facts
    assert keras_faults.matches(r"^\[tfcluster\] warning: worker:1 was killed by SIGKILL; restarting it")
    assert f["w1_rejoin_updates"] > f["w1_kill_updates"]
    assert not keras_faults.matches(r"worker:0 restored the model", f["w1_kill_t"], f["ps_kill_t"])


def test_keras_workers_notice_a_killed_ps_at_once_and_the_chief_restores_the_last_checkpoint(keras_faults,
                                                                                             reliability):
    f, run = keras_faults.facts, keras_faults
    for task in ("worker:0", "worker:1"):
        t, m = run.wait_for(rf"\[{task}\] .*warning: {task} lost its session \((\w+Error): ", 1, after=f["ps_kill_t"])
        reliability(f"keras: seconds from the ps kill to {task}'s {m.group(1)} line", t - f["ps_kill_t"], "s")
        assert t - f["ps_kill_t"] < 15
    t_restored, m = run.wait_for(r"\[worker:0\] .*worker:0 restored the model from \S*model\.ckpt-(\d+) \(", 1,
                                 after=f["ps_kill_t"])
    restored = int(m.group(1))
    assert restored == f["saves_before_ps_kill"][-1]
    # Training goes on from the checkpoint: a batch line read after the restore shows its count, or a few more
    # (the batch that failed with the ps reads the restored counter; the other worker's updates may be in it).
    resumed = min(n for *_, n in updates(run, after=t_restored))
    assert restored <= resumed <= restored + 3
    lost = f["ps_kill_updates"] - restored
    reliability("keras: updates lost to the ps kill (checkpoint every 1 s)", lost, "updates")
    reliability("keras: seconds from the ps kill to the restore", t_restored - f["ps_kill_t"], "s")
    assert lost >= 0


# ==================================================== the ps lost while the chief waits for the others
@pytest.mark.timeout(240)
def test_a_ps_killed_while_the_keras_chief_waits_for_the_others_is_recovered_and_the_run_ends_whole(procs, tmp_path):
    # worker:0 fits 2 epochs (16 batches), worker:1 12: the chief waits at its fit's end, reading the trainers'
    # count on the ps, when the ps dies. It recovers as in a step and counts itself again (the restored ps
    # starts the count at 0), so the run ends once worker:1's fit does. CI saw the chief crash here instead.
    run = keras_local(procs, tmp_path, "--max-restarts", "1", "--timeout", "200",
                      job=["--epochs", "12", "--chief-epochs", "2", "--step-sleep", "0.05", "--save-secs", "1",
                           "--ckpt", str(tmp_path / "ckpt")])
    t_last, _ = run.wait_for(r"^\[worker:0\] worker:0 batch 16 \(", 150)
    run.wait_for(r"^\[worker:1\] worker:1 batch \d+ \(", 60, after=t_last + 0.3)     # worker:1 still trains
    t_kill = time.monotonic()
    os.kill(launched_pid(run, "ps:0"), signal.SIGKILL)
    assert run.finish(timeout=180) == 0, run.tail(60)
    assert run.matches(r"^\[tfcluster\] done: 2 trainer\(s\) succeeded; restarts: ps:0 1$"), run.tail(5)
    assert run.matches(r"\[worker:0\] .*warning: worker:0 lost its session \(\w+Error: ", after=t_kill)
    assert run.matches(r"\[worker:0\] .*worker:0 counts its end again", after=t_kill)
    ends = [int(m.group(1)) for _, m in run.matches(r"\] worker:\d ends with updates (\d+)$")]
    assert len(ends) == 2 and ends[0] == ends[1], ends
    assert no_process_left([int(m.group(1)) for _, m in run.matches(r"started \(pid (\d+)\)")], timeout=10)


# ================================================================ the chief gone
@pytest.mark.timeout(240)
def test_a_keras_chief_gone_for_good_is_named_by_the_worker_in_bounded_time_and_the_ps_still_exits(
        procs, tmp_path, reliability):
    addrs = [f"localhost:{p}" for p in procs.ports(3)]
    cluster = {"worker": addrs[:2], "ps": addrs[2:]}
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps(cluster))
    ps = Stream(procs.cli("start", "--cluster", str(spec), "--job", "ps", "--task", "0", env=base_env(**REUSE)),
                "ps:0")
    w = [Stream(procs.start(KERAS_JOB + ["--epochs", "1000", "--step-sleep", "0.05", "--save-secs", "1",
                                         "--chief-timeout", "5", "--ckpt", str(tmp_path / "ckpt")],
                            env=base_env(TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                                             "index": i}}),
                                         **REUSE)),
                f"worker:{i}") for i in range(2)]
    wait_updates(w[1], 30, 150, task="worker:1")
    w[0].wait_for(r"worker:0 saved checkpoint model\.ckpt-\d+", 60)
    t_kill = time.monotonic()
    os.kill(w[0].proc.pid, signal.SIGKILL)
    t_said, _ = w[1].wait_for(r"keras_job: error: worker:1: the chief \(worker:0\) has not been heard from for "
                              r"(\d+)s \(chief_timeout_secs=5\): .*its last checkpoint is \S+model\.ckpt-\d+", 60,
                              after=t_kill)
    assert w[1].finish(timeout=30) == 3
    assert ps.finish(timeout=30) == 0, ps.tail()        # its done token, and the chief's, let the ps go
    assert re.search(r"every trainer is done; ps:0 exits", ps.text)
    reliability("keras: seconds from the chief's death to the worker's line", t_said - t_kill, "s")
    assert t_said - t_kill < 5 + 2 * 2 + 5          # timeout + two heartbeat intervals + slack


# ====================================================================== the ps stopped
@pytest.mark.timeout(300)
def test_a_keras_ps_that_stops_answering_is_named_in_bounded_time_and_training_resumes_when_it_answers(
        procs, tmp_path, reliability):
    run = keras_local(procs, tmp_path, "--timeout", "250",
                      job=["--epochs", "15", "--step-sleep", "0.05", "--step-timeout", "3"])
    wait_updates(run, 40, 150, task="worker:1")
    ps = launched_pid(run, "ps:0")
    t_stop = time.monotonic()
    os.kill(ps, signal.SIGSTOP)
    try:
        at_stop = max(n for *_, n in updates(run, before=t_stop))
        t_said, _ = run.wait_for(r"\[worker:\d\] .*ps:0 at \S+ has not answered for 3s \(step_timeout_secs\)", 30,
                                 after=t_stop)
        time.sleep(max(0.0, 8 - (time.monotonic() - t_stop)))
    finally:
        t_cont = time.monotonic()
        os.kill(ps, signal.SIGCONT)
    t_back, back = wait_updates(run, 0, 120, after=t_cont + 0.5)
    assert run.finish(timeout=200) == 0, run.tail(60)
    assert back >= at_stop - 2                          # the ps kept the model: nothing rolled back
    assert not run.matches(r"restored the model", after=t_stop)
    reliability("keras: seconds from SIGSTOP of the ps to the workers' line", t_said - t_stop, "s")
    reliability("keras: seconds from SIGCONT to the next update", t_back - t_cont, "s")
    reliability("keras: updates lost to the silent ps", max(0, at_stop - back), "updates")
