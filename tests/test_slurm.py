"""Slurm, for real: a slurmctld, a slurmd per node and munged (tests/slurmhost.py) run tfcluster's jobs.

Two Slurms serve the module: one node on loopback, and three nodes ``h0..h2``
in network-namespace hosts (link-local addresses) with the controller in a
fourth, so Slurm hands out real multi-node host lists and uneven tasks per
node. Jobs are started the way users start them, ``srun ... tfcluster start
--slurm --slurm-ps 1 -- python train.py`` and ``sbatch examples/slurm/...``.

On CI (``CI`` set; .ci/run installs Slurm first with scripts/ci-slurm-setup.sh)
a missing Slurm fails these tests; elsewhere they skip, saying why
(tests/test_slurm_missing.py checks both).
"""

import os
import random
import re
import sys
import time

import pytest

import slurmhost
from conftest import REPO, TFCLUSTER, wait_until
from jobs.stream import Stream
from netns import Hosts
from netns import unavailable_reason as netns_unavailable
from slurmhost import Node, Slurm
from tfcluster.topology.slurm import expand_hostlist

# One Slurm per machine is this file's alone: a file runs on one test worker (pytest.ini). Serial: the tests
# that bound seconds (tests/conftest.py, "tests side by side").
pytestmark = pytest.mark.slow

FIT_JOB = [sys.executable, os.path.join(REPO, "tests", "jobs", "fit_job.py")]
HOROVOD_MNIST = os.path.join(REPO, "tests", "programs", "horovod_mnist.py")
SBATCH_SCRIPT = os.path.join(REPO, "examples", "slurm", "train.sbatch")
#: Each task says where Slurm put it, runs its command, and says how that ended.
TASK_WRAPPER = ['bash', '-c', 'echo "slurm-task $SLURM_PROCID on $SLURMD_NODENAME of $SLURM_STEP_NODELIST '
                '($SLURM_STEP_TASKS_PER_NODE per node)"; "$@"; code=$?; '
                'echo "slurm-task $SLURM_PROCID exit $code"; exit $code', 'task']


def _need(why):
    if why:
        (pytest.fail if slurmhost.required() else pytest.skip)(f"no test Slurm: {why}")


@pytest.fixture(scope="module")
def slurm_one():
    """One Slurm node: this machine, on loopback."""
    _need(slurmhost.unavailable_reason())
    with Slurm([Node("localhost", "127.0.0.1")]) as s:
        yield s


@pytest.fixture(scope="module")
def slurm_hosts():
    """Three Slurm nodes h0, h1, h2, each a network-namespace host; the controller on a fourth."""
    _need(slurmhost.unavailable_reason() or netns_unavailable())
    with Hosts(4) as hosts:
        nodes = [Node(f"h{i}", hosts.addresses[i + 1], hosts.names[i + 1]) for i in range(3)]
        with Slurm(nodes, controller_address=hosts.addresses[0], controller_netns=hosts.names[0]) as s:
            yield s


def srun(slurm, procs, srun_args, task_argv, wrap=True, **env):
    """Start ``srun --label SRUN_ARGS`` of ``task_argv`` (wrapped in :data:`TASK_WRAPPER`); a Stream of its output."""
    argv = slurm.client("srun", "--label", *srun_args, *(TASK_WRAPPER if wrap else []), *task_argv)
    return Stream(procs.start(argv, env=slurm.env(**env), cwd=REPO), "srun")


def task_lines(stream, pattern):
    """``{rank: groups}``: the groups of ``pattern`` in the first line of each task (srun --label) it matches."""
    found = {}
    for _, m in stream.matches(r"^\s*(\d+): .*?" + pattern):
        found.setdefault(int(m.group(1)), m.groups()[1:])
    return found


def _venv_path():
    # The batch script calls `tfcluster` and `python` as users do, from their (exported) PATH.
    return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def assert_nothing_left(slurm):
    """Slurm has no job left, and no process of any job of it is alive."""
    wait_until(lambda: not slurm.jobs(), 30, "Slurm to have no job left (squeue empty)")
    wait_until(lambda: not slurm.processes(), 15, "every process of the jobs to be gone")


# ------------------------------------------------------------------ srun, several nodes
@pytest.mark.netns
@pytest.mark.timeout(240)
def test_srun_trains_a_fit_job_across_three_nodes_to_its_step_target_and_every_task_exits_0(
        slurm_hosts, procs, tmp_path, reliability):
    steps = 200
    ckpt = tmp_path / "ckpt"
    # In a fresh namespace host nothing holds a port: the default port base (8888) is what users get.
    job = srun(slurm_hosts, procs, ["-N", "3", "-n", "4"],
               TFCLUSTER + ["start", "--slurm", "--slurm-ps", "1", "--"] + FIT_JOB
               + ["--steps", str(steps), "--ckpt", str(ckpt), "--mode", "async", "--save-steps", "100"])
    code = job.finish(timeout=200)
    assert code == 0, job.tail(60)

    placed = task_lines(job, r"slurm-task \d+ on (\S+) of (\S+) \((\S+) per node\)")
    exits = task_lines(job, r"slurm-task \d+ exit (\d+)")
    serving = task_lines(job, r"(ps:\d+|worker:\d+) serving on (\S+):(\d+)")
    assert sorted(placed) == sorted(exits) == sorted(serving) == [0, 1, 2, 3], job.tail(60)
    assert {r: int(m[0]) for r, m in exits.items()} == {0: 0, 1: 0, 2: 0, 3: 0}
    # Slurm's own view: a compressed host list and uneven tasks per node.
    assert {m[1] for m in placed.values()} == {"h[0-2]"}
    assert {m[2] for m in placed.values()} == {"2,1(x2)"}
    # tfcluster's: ps first, then the workers, each on the node Slurm ran it on, ports from 8888 per node.
    layout = {r: (serving[r][0], serving[r][1], int(serving[r][2])) for r in serving}
    assert layout == {0: ("ps:0", "h0", 8888), 1: ("worker:0", "h0", 8889),
                      2: ("worker:1", "h1", 8888), 3: ("worker:2", "h2", 8888)}
    assert all(placed[r][0] == layout[r][1] for r in layout)

    finished = task_lines(job, r"finished (worker:\d+): global step (\d+)")
    assert sorted(m[0] for m in finished.values()) == ["worker:0", "worker:1", "worker:2"]
    reached = max(int(m[1]) for m in finished.values())
    assert steps <= reached <= steps + 3   # async: the other workers may each finish one step in flight
    per_node = {}
    for r in sorted(layout):
        per_node.setdefault(layout[r][1], []).append(layout[r][0])
    reliability("srun -N 3 -n 4: tasks per node", "; ".join(f"{n}: {' '.join(t)}" for n, t in per_node.items()))
    reliability("srun -N 3 -n 4: global step reached (target)", f"{reached} ({steps})")
    assert_nothing_left(slurm_hosts)


@pytest.mark.netns
@pytest.mark.timeout(240)
def test_srun_runs_a_horovod_program_as_ranks_of_two_hosts_with_local_and_cross_ranks_and_one_model(
        slurm_hosts, procs, tmp_path, reliability):
    import numpy as np
    out = tmp_path / "out"
    # Slurm starts the ranks, as mpirun did for Horovod: h0 gets two, h1 one.
    job = srun(slurm_hosts, procs, ["-N", "2", "-n", "3"],
               TFCLUSTER + ["start", "--slurm", "--slurm-ps", "0", "--tf1", "--", sys.executable, HOROVOD_MNIST,
                            "--out", str(out)])
    code = job.finish(timeout=200)
    assert code == 0, job.tail(60)
    ranks = task_lines(job, r"rank (\d) of (\d) \(local rank (\d), host (\d) of (\d)\): 20 steps")
    placed = task_lines(job, r"slurm-task \d+ on (\S+) of")
    assert sorted(ranks) == [0, 1, 2], job.tail(60)
    # rank, size, local rank, host, hosts: local ranks count a host's ranks, cross ranks the hosts.
    assert {tuple(int(x) for x in ranks[r]) for r in ranks} == {(0, 3, 0, 0, 2), (1, 3, 1, 0, 2), (2, 3, 0, 1, 2)}
    reliability("srun -N 2 -n 3 Horovod ranks: (rank, local rank, host)",
                "; ".join(f"{placed[r][0]}: ({ranks[r][0]}, {ranks[r][2]}, {ranks[r][3]})" for r in sorted(ranks)))
    weights = [np.load(out / f"weights-{rank}.npz") for rank in range(3)]
    for key in weights[0].files:
        assert weights[0][key].tobytes() == weights[1][key].tobytes() == weights[2][key].tobytes()
    assert_nothing_left(slurm_hosts)


# ------------------------------------------------------------------ the end of a job
@pytest.mark.serial
@pytest.mark.timeout(180)
def test_a_finished_worker_whose_ps_is_already_gone_neither_waits_nor_warns(slurm_one, procs, tmp_path, reliability):
    # fit tells the ps that its worker is done; the ps exits once every trainer has. tfcluster start then
    # telling it again reached a ps that was exiting: 18 s and a warning per worker (issue 17).
    base = slurmhost.consecutive_free_ports(3)
    job = srun(slurm_one, procs, ["-n", "3", "--overcommit"],
               TFCLUSTER + ["start", "--slurm", "--slurm-ps", "1", "--slurm-port-base", str(base), "--"] + FIT_JOB
               + ["--steps", "150", "--ckpt", str(tmp_path / "ckpt"), "--mode", "async", "--save-steps", "1000"])
    code = job.finish(timeout=150)
    t_end = time.monotonic()
    assert code == 0, job.tail(60)
    t_last_step = max(t for t, _ in job.matches(r"step \d+ \(global \d+\)"))
    # Per worker: from its command's last line to the end of its tfcluster start.
    after = []
    for rank, name in ((1, "worker:0"), (2, "worker:1")):
        (t_done, _), = job.matches(rf"^\s*{rank}: finished {name}: global step")
        (t_exit, _), = job.matches(rf"^\s*{rank}: slurm-task {rank} exit 0")
        after.append(t_exit - t_done)
    assert job.matches(r"^\s*0: .*every trainer is done; ps:0 exits")
    assert not job.matches(r"could not tell|tfcluster: warning|Traceback"), job.text[-3000:]
    reliability("seconds from the last training step to the job's end", t_end - t_last_step, "s")
    reliability("seconds a finished worker's tfcluster start takes after its command (max)", max(after), "s")
    # The ps lingers 2 s after the last token (server.py, _DONE_LINGER); the rest is processes exiting.
    # Telling an exiting ps again waited out a 10 s deadline (14.6 s in all); now a worker's start ends with its
    # command, whose exit (TensorFlow's teardown) takes 1-5 s on a loaded 2-core machine.
    assert max(after) < 8 and t_end - t_last_step < 15, (after, t_end - t_last_step)
    assert_nothing_left(slurm_one)


# ------------------------------------------------------------------ sbatch
@pytest.mark.netns
@pytest.mark.timeout(240)
def test_sbatch_wait_runs_the_example_batch_script_to_exit_0(slurm_hosts, tmp_path, reliability):
    out = tmp_path / "job-%j.out"
    start = time.monotonic()
    r = slurm_hosts.run("sbatch", "--wait", "--parsable", "-o", out, SBATCH_SCRIPT,
                        "--steps", "100", "--model", "mlp", check=False, timeout=200, cwd=REPO,
                        env=slurm_hosts.env(CHECKPOINT_DIR=tmp_path / "ckpt", PATH=_venv_path()))
    took = time.monotonic() - start
    job_id = r.stdout.strip().split(";")[0]
    assert job_id.isdigit(), r.stdout + r.stderr
    text = (tmp_path / f"job-{job_id}.out").read_text()
    assert r.returncode == 0, text[-4000:]
    # The batch script ran on two nodes, three tasks: ps:0 and two workers; the chief printed its accuracy.
    assert re.search(r"tfcluster-digits: job \d+ on h\[0-1\] \(3 tasks\)", text), text[-4000:]
    m = re.search(r"test accuracy (\d\.\d+) \(loss [\d.]+, step (\d+)", text)
    assert m and int(m.group(2)) >= 100, text[-4000:]
    state = slurm_hosts.run("scontrol", "show", "job", job_id).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state
    h, mnt, sec = re.search(r"RunTime=(\d+):(\d+):(\d+)", state).groups()
    # sbatch --wait polls the job after 2, 10 and 42 s: its own time is mostly that wait.
    reliability("sbatch train.sbatch (100 steps): the job's RunTime", f"{int(h) * 3600 + int(mnt) * 60 + int(sec)} s")
    reliability("sbatch --wait train.sbatch: seconds until it returned", took, "s")
    assert_nothing_left(slurm_hosts)


# ------------------------------------------------------------------ host lists
SHAPES = ["h[0-2]", "n[1-3,5],x7", "n[01-10]", "c[098-101]", "n[9-10]", "rack[1-2]-n[1-2]", "n[1-2][3-4]",
          "h0,h[1-2]", "a-b[1-2],login1", "gpu1[0-2]"]


@pytest.mark.timeout(60)
def test_the_host_list_parser_agrees_with_scontrol_show_hostnames(slurm_one):
    for shape in SHAPES:
        theirs = slurm_one.run("scontrol", "show", "hostnames", shape).stdout.split()
        assert expand_hostlist(shape) == theirs, shape
    # And on lists Slurm compressed itself, from names with gaps, zero padding and several prefixes.
    names = ["n01", "n02", "n03", "n05", "n10", "x7", "gpu008", "gpu009", "gpu010", "login1"]
    compressed = slurm_one.run("scontrol", "show", "hostlist", ",".join(names)).stdout.strip()
    assert "[" in compressed and expand_hostlist(compressed) == names, compressed


# ------------------------------------------------------------------ scancel
STEP = r"(worker:\d) step \d+ \(global (\d+)\)"
STOPPED = r"(\S+) stopped on SIGTERM after global step (\d+): saved model\.ckpt-(\d+) ([\d.]+)s after the signal"


def global_steps(stream, after=0.0, before=float("inf")) -> list:
    """Every global step a worker logged in the window."""
    return [int(m.group(2)) for _, m in stream.matches(STEP, after, before)]


# Under `srun tfcluster start --slurm -- python train.py` the ps is fit's own ps role, not a server hosted
# by tfcluster start: it serves on after its SIGTERM while a trainer answers (server.drain_on_sigterm), so
# the chief's last checkpoint still reaches it; before, the workers lost their session before they could
# save and sat in recovery until Slurm's SIGKILL 30 s later (KillWait).
@pytest.mark.netns
@pytest.mark.serial
@pytest.mark.timeout(300)
def test_scancel_mid_training_saves_a_checkpoint_ends_every_task_and_a_resubmitted_job_resumes_after_it(
        slurm_hosts, procs, tmp_path, reliability):
    ckpt = tmp_path / "ckpt"

    def submit(steps):
        # No wrapper: Slurm signals each task's process group, which here is tfcluster start's, as users run it.
        return srun(slurm_hosts, procs, ["-N", "2", "-n", "3"],
                    TFCLUSTER + ["start", "--slurm", "--slurm-ps", "1", "--"] + FIT_JOB
                    + ["--mode", "async", "--steps", str(steps), "--step-sleep", "0.02", "--save-steps", "100000",
                       "--ckpt", str(ckpt)], wrap=False)
    at = random.Random(os.environ.get("FAULT_SEED", "17")).randint(30, 90)
    run = submit(100000)
    run.wait_for(r"^\s*2: .*worker:1 step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= at)
    job_id, = slurm_hosts.jobs()
    t_term = time.monotonic()
    slurm_hosts.run("scancel", job_id)
    run.finish(timeout=90)
    t_end = time.monotonic()
    _, m = run.wait_for(r"^\s*1: .*" + STOPPED, 1)
    saved = int(m.group(3))
    assert run.matches(r"^\s*2: .*worker:1 stopped on SIGTERM after global step \d+, [\d.]+s after the signal "
                       r"\(this task writes no checkpoint\)"), run.tail(60)
    assert_nothing_left(slurm_hosts)
    # Every step any worker took is in the checkpoint.
    assert max(global_steps(run)) <= saved, (max(global_steps(run)), saved)

    again = submit(saved + 10)
    assert again.finish(timeout=150) == 0, again.tail(60)
    assert again.matches(rf"^\s*1: .*restored the model from \S*model\.ckpt-{saved} \("), again.tail(60)
    assert min(global_steps(again)) == saved + 1
    lost = max(global_steps(run)) - (min(global_steps(again)) - 1)
    reliability(f"scancel at step {saved}: steps lost", lost, "steps")
    reliability("scancel: seconds from SIGTERM to the chief's saved checkpoint", float(m.group(4)), "s")
    reliability("scancel: seconds from scancel to the job's end", t_end - t_term, "s")
    assert lost == 0 and t_end - t_term < 30   # inside Slurm's KillWait (30 s): nothing was SIGKILLed
    assert_nothing_left(slurm_hosts)
