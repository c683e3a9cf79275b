"""The faults users of TF1 clusters report most, for real, each ending the right way with one clear line.

- the chief dies and comes back: it joins the model the ps tasks hold, and nobody rolls back;
- the chief dies for good: the workers say so in bounded time, stop, and the ps still exits;
- a ps stops answering (SIGSTOP, as a hung host): the workers name it in bounded time and go on once it
  answers again;
- the disk fills during a save (a small tmpfs): one line per failed save, no partial checkpoint, the last
  good one stays latest and restores; a restarted run resumes from it;
- the latest checkpoint is truncated: the newest good one is restored, with a warning naming both; also
  when the ps is killed and the chief restores it into the new ps;
- the evaluator skips a checkpoint that vanished or cannot be read;
- the ps is lost before the first save: the model is initialised again, and the chief says so;
- sync with 3 workers aggregating 2: a killed non-chief holds nothing up, a killed chief rejoins.

Every figure (steps lost, seconds to detect, seconds to resume) goes to the reliability table printed at the
end of the test run.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from conftest import TFCLUSTER, base_env
from held_ports import REUSE
from jobs.stream import Stream

HERE = os.path.dirname(os.path.abspath(__file__))
FIT_JOB = [sys.executable, os.path.join(HERE, "jobs", "fit_job.py")]
STEP = r"\[(worker:\d)\] .*step \d+ \(global (\d+)"

pytestmark = pytest.mark.slow
#: A fault whose detection is bounded in seconds, or a step that must never wait: alone on the machine
#: (tests/conftest.py). The tests that assert only steps, restores and lines run beside others.
timed = pytest.mark.serial


def steps_of(stream, task, after=0.0, before=float("inf")):
    """[(time, global step)] of ``task``'s step lines in the window."""
    return [(t, int(m.group(2))) for t, m in stream.matches(STEP, after, before) if m.group(1) == task]


def local_run(procs, tmp, *launcher, job=()):
    """``tfcluster local`` of fit_job, as a Stream (every line timed as it arrives)."""
    cmd = TFCLUSTER + ["local", "--log-dir", str(tmp / "logs"), *launcher, "--"] + FIT_JOB + list(job)
    return Stream(procs.start(cmd, cwd=str(tmp)), "tfcluster local")


def launched_pid(stream, task, nth=0):
    return [int(m.group(1)) for _, m in stream.matches(rf"^\[tfcluster\] {re.escape(task)} (?:re)?started "
                                                      r"\(pid (\d+)\)")][nth]


# ================================================================ the chief
@pytest.mark.timeout(300)
def test_a_restarted_chief_joins_the_live_model_and_nobody_rolls_back(procs, tmp_path, reliability):
    run = local_run(procs, tmp_path, "--ps", "1", "--workers", "2", "--max-restarts", "1", "--timeout", "250",
                    job=["--mode", "async", "--steps", "250", "--ckpt", str(tmp_path / "ckpt"), "--save-steps",
                         "100", "--step-sleep", "0.1"])
    run.wait_for(r"\[worker:1\] .*step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= 60)
    t_kill = time.monotonic()
    os.kill(launched_pid(run, "worker:0"), signal.SIGKILL)
    at_kill = max(g for _, g in steps_of(run, "worker:0", before=t_kill))
    t_join, _ = run.wait_for(r"\[worker:0\] .*worker:0 joined the model the ps tasks hold", 120, after=t_kill)
    _, first = run.wait_for(r"\[worker:0\] .*first step done .*global step (\d+)", 60, after=t_join)
    assert run.finish(timeout=200) == 0, run.tail(60)
    rejoined_at = int(first.group(1))
    # worker:1's global step never went back: no restore over the live ps.
    w1 = [g for _, g in steps_of(run, "worker:1")]
    assert all(b >= a - 2 for a, b in zip(w1, w1[1:])), "worker:1's global step went back"
    assert rejoined_at > at_kill
    assert not run.matches(r"\[worker:0\] .*restored the model", after=t_kill)
    reliability("global steps rolled back", max(0, at_kill - rejoined_at), "steps")
    reliability("seconds from the kill to the chief's rejoin", t_join - t_kill, "s")


class HandCluster:
    """ps and two workers started by hand (as `tfcluster start` or Slurm would), each a Stream."""

    def __init__(self, procs, tmp, *job_args, workers=2):
        self.ckpt = str(tmp / "ckpt")
        addrs = [f"localhost:{p}" for p in procs.ports(workers + 1)]
        self.cluster = {"worker": addrs[:workers], "ps": addrs[workers:]}
        spec = tmp / "cluster.json"
        spec.write_text(json.dumps(self.cluster))
        self.ps = Stream(procs.cli("start", "--cluster", str(spec), "--job", "ps", "--task", "0",
                                   env=base_env(**REUSE)), "ps:0")
        self.w = [Stream(procs.start(FIT_JOB + ["--ckpt", self.ckpt, *job_args], env=base_env(
            TF_CONFIG=json.dumps({"cluster": self.cluster, "task": {"type": "worker", "index": i}}), **REUSE)),
            f"worker:{i}") for i in range(workers)]


@timed
@pytest.mark.timeout(240)
def test_a_chief_gone_for_good_is_named_by_the_workers_in_bounded_time_and_the_ps_still_exits(
        procs, tmp_path, reliability):
    c = HandCluster(procs, tmp_path, "--mode", "async", "--steps", "100000", "--step-sleep", "0.05",
                    "--save-steps", "20", "--chief-timeout", "5")
    c.w[1].wait_for(r"worker:1 .*step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= 30)
    t_kill = time.monotonic()
    os.kill(c.w[0].proc.pid, signal.SIGKILL)
    t_said, m = c.w[1].wait_for(r"fit_job: error: worker:1: the chief \(worker:0\) has not been heard from for "
                                r"(\d+)s \(chief_timeout_secs=5\): .*its last checkpoint is \S+model\.ckpt-\d+", 60,
                                after=t_kill)
    assert c.w[1].finish(timeout=30) == 3
    # Its done token, and the chief's, let the ps go: it does not wait forever.
    assert c.ps.finish(timeout=30) == 0, c.ps.tail()
    assert re.search(r"every trainer is done; ps:0 exits", c.ps.text)
    assert t_said - t_kill < 5 + 2 * 2 + 5           # timeout + two heartbeat intervals + slack
    reliability("seconds from the chief's death to the workers' line", t_said - t_kill, "s")


# ==================================================================== the ps
@timed
@pytest.mark.timeout(300)
def test_a_ps_that_stops_answering_is_named_in_bounded_time_and_training_resumes_when_it_answers(
        procs, tmp_path, reliability):
    run = local_run(procs, tmp_path, "--ps", "1", "--workers", "2", "--timeout", "250",
                    job=["--mode", "async", "--steps", "160", "--ckpt", str(tmp_path / "ckpt"), "--save-steps",
                         "100", "--step-sleep", "0.05", "--step-timeout", "3"])
    run.wait_for(r"\[worker:1\] .*step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= 40)
    ps = launched_pid(run, "ps:0")
    t_stop = time.monotonic()
    os.kill(ps, signal.SIGSTOP)
    try:
        at_stop = max(g for _, g in steps_of(run, "worker:0", before=t_stop))
        t_said, _ = run.wait_for(r"\[worker:\d\] .*ps:0 at \S+ has not answered for 3s \(step_timeout_secs\)", 30,
                                 after=t_stop)
        time.sleep(max(0.0, 8 - (time.monotonic() - t_stop)))
    finally:
        t_cont = time.monotonic()
        os.kill(ps, signal.SIGCONT)
    t_back, m = run.wait_for(r"\[worker:0\] .*step \d+ \(global (\d+)", 120, after=t_cont + 0.5)
    assert run.finish(timeout=200) == 0, run.tail(60)
    assert int(m.group(1)) >= at_stop - 2           # the ps kept the model: nothing rolled back
    assert not run.matches(r"restored the model", after=t_stop)
    reliability("seconds from SIGSTOP of the ps to the workers' line", t_said - t_stop, "s")
    reliability("seconds from SIGCONT to the next step", t_back - t_cont, "s")
    reliability("global steps lost to the silent ps", max(0, at_stop - int(m.group(1))), "steps")


@pytest.mark.timeout(300)
def test_a_ps_lost_before_the_first_save_is_initialised_again_and_the_chief_says_so(procs, tmp_path, reliability):
    run = local_run(procs, tmp_path, "--ps", "1", "--workers", "2", "--max-restarts", "1", "--timeout", "250",
                    job=["--mode", "async", "--steps", "120", "--ckpt", str(tmp_path / "ckpt"), "--save-secs",
                         "3600", "--step-sleep", "0.05"])
    run.wait_for(r"\[worker:0\] .*step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= 30)
    t_kill = time.monotonic()
    os.kill(launched_pid(run, "ps:0"), signal.SIGKILL)
    at_kill = max(g for _, g in steps_of(run, "worker:0", before=t_kill))
    run.wait_for(r"\[worker:0\] .*the ps tasks lost the model before any checkpoint was written: initialising it "
                 r"again, and training starts over from global step 0", 120, after=t_kill)
    assert run.finish(timeout=200) == 0, run.tail(60)
    assert not run.matches(r"restoring the last checkpoint")      # what it used to claim
    reliability("global steps lost (no checkpoint yet)", at_kill, "steps")


@pytest.mark.timeout(300)
def test_a_killed_ps_whose_newest_checkpoint_is_truncated_recovers_from_the_older_one(procs, tmp_path, reliability):
    ckpt = tmp_path / "ckpt"
    run = local_run(procs, tmp_path, "--ps", "1", "--workers", "2", "--max-restarts", "1", "--timeout", "250",
                    job=["--mode", "async", "--steps", "200", "--ckpt", str(ckpt), "--save-steps", "40",
                         "--step-sleep", "0.05"])
    run.wait_for(r"\[worker:0\] .*saved checkpoint model\.ckpt-(\d+)", 150, check=lambda m: int(m.group(1)) >= 80)
    saved = sorted(int(f.name[len("model.ckpt-"):-len(".index")]) for f in ckpt.glob("model.ckpt-*.index"))
    older, newest = saved[-2:]
    data = next(ckpt.glob(f"model.ckpt-{newest}.data-*"))
    data.write_bytes(data.read_bytes()[:20])              # the disk lied about the last save
    t_kill = time.monotonic()
    os.kill(launched_pid(run, "ps:0"), signal.SIGKILL)
    at_kill = max(g for _, g in steps_of(run, "worker:0", before=t_kill))
    run.wait_for(rf"\[worker:0\] .*worker:0 restored \S+model\.ckpt-{older} instead of the newest checkpoint, "
                 rf"\S+model\.ckpt-{newest}, which cannot be read", 120, after=t_kill)
    assert run.finish(timeout=200) == 0, run.tail(60)
    assert (ckpt / "unreadable" / data.name).exists()
    reliability("ps killed, newest checkpoint truncated: global steps lost", at_kill - older, "steps")


# ======================================================== sync, 2 of 3 workers
@timed
@pytest.mark.timeout(330)
def test_a_sync_run_aggregating_2_of_3_workers_outlives_a_killed_non_chief_and_a_killed_chief(
        procs, tmp_path, reliability):
    run = local_run(procs, tmp_path, "--ps", "1", "--workers", "3", "--max-restarts", "1", "--timeout", "300",
                    job=["--mode", "sync", "--replicas", "2", "--steps", "160", "--ckpt", str(tmp_path / "ckpt"),
                         "--save-steps", "50", "--step-sleep", "0.05", "--stall-warn", "2"])
    run.wait_for(r"\[worker:2\] .*step \d+ \(global (\d+)", 200, check=lambda m: int(m.group(1)) >= 20)
    t_kill2 = time.monotonic()
    os.kill(launched_pid(run, "worker:2"), signal.SIGKILL)
    run.wait_for(r"\[worker:0\] .*step \d+ \(global (\d+)", 60, after=t_kill2 + 0.5)
    # Two workers fill every step: the chief never waits for the dead one.
    t_steps = time.monotonic() + 3
    run.wait_for(r"\[worker:0\] .*step \d+ \(global (\d+)", 60, after=t_steps)
    assert not run.matches(r"\[worker:0\] .*has waited", after=t_kill2, before=t_steps)
    t_kill0 = time.monotonic()
    at_kill0 = max(g for _, g in steps_of(run, "worker:0", before=t_kill0))
    os.kill(launched_pid(run, "worker:0"), signal.SIGKILL)
    t_join, _ = run.wait_for(r"\[worker:0\] .*worker:0 joined the model the ps tasks hold", 150, after=t_kill0)
    _, first = run.wait_for(r"\[worker:0\] .*first step done .*global step (\d+)", 60, after=t_join)
    assert run.finish(timeout=240) == 0, run.tail(80)
    assert int(first.group(1)) > at_kill0 - 1
    reliability("sync 2 of 3: seconds from the chief's kill to its rejoin", t_join - t_kill0, "s")
    reliability("sync 2 of 3: global steps rolled back by the chief's restart",
                max(0, at_kill0 - int(first.group(1)) + 1), "steps")


# ============================================================ checkpoint files
def one_process(tmp, *job, env=None):
    r = subprocess.run(FIT_JOB + ["--mode", "local", *job], env=env or base_env(), cwd=str(tmp),
                       capture_output=True, text=True, timeout=200)
    return r, r.stdout + r.stderr


@pytest.mark.timeout(240)
def test_a_truncated_latest_checkpoint_is_skipped_for_the_newest_good_one_with_a_warning_naming_both(
        tmp_path, reliability):
    ckpt = tmp_path / "ckpt"
    r, out = one_process(tmp_path, "--steps", "40", "--ckpt", str(ckpt), "--save-steps", "10", "--keep", "5")
    assert r.returncode == 0, out[-3000:]
    data = next(ckpt.glob("model.ckpt-40.data-*"))
    data.write_bytes(data.read_bytes()[:20])              # a save cut short, or a disk that lied
    r, out = one_process(tmp_path, "--steps", "50", "--ckpt", str(ckpt), "--save-steps", "10", "--keep", "5")
    assert r.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert re.search(r"local restored \S+model\.ckpt-30 instead of the newest checkpoint, \S+model\.ckpt-40, which "
                     r"cannot be read", out), out[-3000:]
    assert re.search(r"local first step done .* global step 31\b", out)
    reliability("steps lost to a truncated latest checkpoint", 40 - 30, "steps")


FULL_DISK = r'''
set -u
mount -t tmpfs -o size={size} tmpfs {disk}
head -c {filler} /dev/zero > {disk}/filler
{job} --steps 30 > {disk}/../first.log 2>&1
echo "FIRST=$?"
ls {ckpt}
rm {disk}/filler                       # room again: the restarted run goes on from the last good one
{job} --steps 40 --keep 2 > {disk}/../second.log 2>&1
echo "SECOND=$?"
ls {ckpt}
'''


@pytest.mark.timeout(300)
def test_a_full_disk_fails_each_save_in_one_line_leaves_no_partial_checkpoint_and_a_restart_resumes(
        tmp_path, reliability):
    if os.geteuid() != 0 or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs root and mount namespaces to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    ckpt = disk / "ckpt"
    job = " ".join(shlex.quote(a) for a in FIT_JOB + ["--mode", "local", "--ckpt", str(ckpt), "--save-steps", "5",
                                                       "--keep", "20", "--ballast-mb", "1"])
    # 1 MB a checkpoint: with the filler, the first two saves fit and then the disk is full.
    script = FULL_DISK.format(size="8m", disk=disk, filler=5800 * 1024, job=job, ckpt=ckpt)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, cwd=str(tmp_path), env=base_env(), timeout=280)
    first, second = (tmp_path / "first.log").read_text(), (tmp_path / "second.log").read_text()
    assert "FIRST=" in r.stdout, r.stdout + r.stderr
    listing = r.stdout.split("FIRST=", 1)[1].split("SECOND=", 1)[0].splitlines()   # ckpt/ after the first run
    failed = re.findall(r"local could not save checkpoint model\.ckpt-(\d+) \((\w+): (.*?)\)", first)
    assert failed, first[-3000:]
    assert all(kind == "ResourceExhaustedError" and "No space left" in why for _, kind, why in failed)
    assert "training goes on" in first and re.search(r"local step \d+ \(global 2[0-9]", first)
    # The final save failed too: the run says so in one line (and exits 3) instead of a crash loop later.
    assert r.stdout.split("FIRST=", 1)[1].startswith("3"), first[-3000:]
    assert re.search(r"fit_job: error: local could not save its final checkpoint model\.ckpt-30: .*No space "
                     r"left on device.*; the latest checkpoint is model\.ckpt-\d+", first)
    saved = [int(n) for n in re.findall(r"local saved checkpoint model\.ckpt-(\d+)", first)]
    on_disk = [n for n in listing[1:] if n.startswith("model.ckpt") or "_temp" in n]
    assert all(f"model.ckpt-{n}" not in " ".join(on_disk) for n, _, _ in failed), on_disk   # no partial files
    assert not [n for n in on_disk if "_temp" in n]
    # With room again, a restart resumes from the last good checkpoint and finishes.
    assert "SECOND=0" in r.stdout, second[-3000:]
    assert re.search(rf"local restored the model from \S+model\.ckpt-{saved[-1]}\b", second)
    reliability("full disk: saves that failed (one line each)", len(failed), "")
    reliability("full disk: steps after the last good checkpoint, retrained", 30 - saved[-1], "steps")


def trained_checkpoints(tmp_path, steps):
    """tests/_fit_job.py's model trained ``steps`` steps, a checkpoint every 10: ``(job, data, checkpoint dir)``."""
    tf = pytest.importorskip("tensorflow")
    sys.path.insert(0, HERE)
    import _fit_job as job
    from tfcluster.training.train import fit
    data = job.make_data(str(tmp_path / "data.npz"))
    ckpt = tmp_path / "ckpt"
    fit(job.make_model_fn(data), job.make_input_fn(data), steps=steps, batch_size=32, checkpoint_dir=str(ckpt),
        optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(0.5), save_checkpoint_steps=10,
        save_checkpoint_secs=None, log_every_secs=60)
    return job, data, ckpt


def test_the_evaluator_skips_a_checkpoint_that_vanished_or_cannot_be_read(tmp_path, reliability):
    from tfcluster.training.evaluation import run_evaluator
    job, data, ckpt = trained_checkpoints(tmp_path, 30)
    next(ckpt.glob("model.ckpt-10.data-*")).unlink()            # rotated away under the evaluator
    data20 = next(ckpt.glob("model.ckpt-20.data-*"))
    data20.write_bytes(data20.read_bytes()[:10])               # cut short
    results = run_evaluator(job.make_model_fn(data), job.make_eval_input_fn(data), str(ckpt), poll_secs=0.1)
    assert [r["global_step"] for r in results] == [30]
    reliability("evaluator: unreadable checkpoints skipped", 2, "")


def test_a_checkpoint_the_chief_deletes_while_the_evaluator_reads_it_is_still_evaluated(tmp_path):
    # A chief that saves faster than the evaluator evaluates rotates each checkpoint away mid-read; the evaluator
    # reads from hard links it made first (runtime/checkpoints.py pinned), so the evaluation still sees the files.
    tf = pytest.importorskip("tensorflow")
    from tfcluster.training.checkpoint_watch import watch_checkpoints
    _, _, ckpt = trained_checkpoints(tmp_path, 10)
    read = []

    def evaluate(path, final):
        for f in ckpt.glob("model.ckpt-10.*"):
            f.unlink()                                  # the chief's rotation, while the evaluator reads
        read.append(int(tf.train.load_checkpoint(path).get_tensor("global_step")))
    watch_checkpoints(str(ckpt), evaluate, poll_secs=0.1, final_step=10)
    assert read == [10]
    assert not list(ckpt.glob(".tfcluster-reading-*"))        # the links go once it is read
