"""One device and a fair share of cores per task: who gets which GPUs and how many threads.

This machine has no GPU, so the GPU list is a fake one, given the way a
launcher on a GPU machine would get it: the ``CUDA_VISIBLE_DEVICES`` it
inherits (or ``nvidia-smi -L``'s output, for the rules alone). The run at the
end is a real ``tfcluster local`` whose tasks print the environment they got.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import base_env, run_cli
from tfcluster.topology.cluster import Task
from tfcluster.topology.devices import Resources, assign_local, assign_slurm, list_gpus
from tfcluster.core.errors import SpecError

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
PS, W0, W1, CHIEF, EVAL = Task("ps", 0), Task("worker", 0), Task("worker", 1), Task("chief", 0), Task("evaluator", 0)


def env_of(resources: Resources, base=None) -> dict:
    return resources.apply(dict(base or {}))


# ------------------------------------------------------------------ listing GPUs without TensorFlow
def test_the_gpus_the_launcher_inherited_are_the_ones_it_hands_out():
    assert list_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == (["0", "1", "2", "3"], "CUDA_VISIBLE_DEVICES=0,1,2,3")
    assert list_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"})[0] == ["GPU-aa", "GPU-bb"]
    # CUDA stops at the first invalid id: "" and "-1" both mean no GPU.
    assert list_gpus({"CUDA_VISIBLE_DEVICES": ""})[0] == []
    assert list_gpus({"CUDA_VISIBLE_DEVICES": "-1"})[0] == []
    assert list_gpus({"CUDA_VISIBLE_DEVICES": "2,-1,3"})[0] == ["2"]


def test_without_cuda_visible_devices_nvidia_smi_lists_them():
    out = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-1)\nGPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-2)\n"
    seen = []

    def smi(argv):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")
    assert list_gpus({}, run=smi) == (["0", "1"], "nvidia-smi -L")
    assert seen == [["nvidia-smi", "-L"]]


def test_no_nvidia_smi_or_a_failing_one_means_no_gpu_and_says_why():
    def missing(argv):
        raise FileNotFoundError(argv[0])

    def failing(argv):
        return subprocess.CompletedProcess(argv, 9, "", "NVIDIA-SMI has failed")
    assert list_gpus({}, run=missing) == ([], "nvidia-smi not found")
    assert list_gpus({}, run=failing) == ([], "nvidia-smi exited with code 9")


# ------------------------------------------------------------------ the local rules
def test_four_gpus_two_workers_one_ps_each_worker_gets_two_and_the_ps_none():
    got = assign_local([PS, W0, W1], ["0", "1", "2", "3"], cores=8)
    assert env_of(got[W0]) == {"CUDA_VISIBLE_DEVICES": "0,1", "TF_NUM_INTRAOP_THREADS": "3",
                               "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "3"}
    assert env_of(got[W1])["CUDA_VISIBLE_DEVICES"] == "2,3"
    # Two inter-op threads even on one core: with one, an op waiting for another blocks for good (docs/tf2.md).
    assert env_of(got[PS]) == {"CUDA_VISIBLE_DEVICES": "", "TF_NUM_INTRAOP_THREADS": "1",
                               "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "1"}


def test_gpus_per_worker_takes_that_many_in_order_and_the_evaluator_gets_what_is_left():
    got = assign_local([PS, CHIEF, W0, EVAL], ["0", "1", "2", "3"], cores=4, gpus_per_worker=1)
    assert [got[t].gpus for t in (CHIEF, W0, PS, EVAL)] == [("0",), ("1",), (), ("2",)]


def test_asking_for_more_gpus_than_listed_is_one_error_naming_the_option():
    with pytest.raises(SpecError, match=r"gpus_per_worker 2 for 3 trainer\(s\) needs 6 GPUs; 4 listed"):
        assign_local([W0, W1, CHIEF], ["0", "1", "2", "3"], cores=2, gpus_per_worker=2)


def test_fewer_gpus_than_trainers_are_shared_in_turn_with_memory_growth():
    got = assign_local([PS, W0, W1, Task("worker", 2)], ["0", "1"], cores=2)
    assert [got[Task("worker", i)].gpus for i in range(3)] == [("0",), ("1",), ("0",)]
    assert env_of(got[W0])["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


def test_no_gpu_listed_leaves_the_trainers_as_they_are_and_still_keeps_the_ps_off_gpus():
    got = assign_local([PS, W0, W1], [], cores=2)
    assert got[W0].gpus is None and "CUDA_VISIBLE_DEVICES" not in env_of(got[W0])
    assert got[PS].gpus == ()
    assert assign_local([W0], [], cores=2, gpus_per_worker=0)[W0].gpus == ()


def test_threads_split_the_cores_among_trainers_and_never_go_below_one():
    assert assign_local([PS, W0, W1], [], cores=2)[W0].threads == 1
    assert assign_local([PS, W0, W1], [], cores=9)[W0].threads == 4
    assert assign_local([W0, W1], [], cores=8)[W1].threads == 4


def test_threads_per_task_overrides_even_exported_values_and_zero_leaves_tensorflows_defaults():
    exported = {"TF_NUM_INTRAOP_THREADS": "16"}
    auto = assign_local([W0], [], cores=4)[W0]
    assert env_of(auto, exported)["TF_NUM_INTRAOP_THREADS"] == "16"       # the user's own setting is kept
    forced = assign_local([PS, W0], [], cores=4, threads_per_task=3)
    assert env_of(forced[W0], exported)["TF_NUM_INTRAOP_THREADS"] == "3"
    assert forced[PS].threads == 3
    assert env_of(assign_local([W0], [], cores=4, threads_per_task=0)[W0]) == {}


# ------------------------------------------------------------------ Slurm, as SlurmClusterResolver
SLURM = {"SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_CPUS_PER_TASK": "6"}


@pytest.mark.parametrize("local_id, want", [("0", ("0", "1")), ("1", ("2", "3"))])
def test_under_slurm_the_local_id_picks_this_tasks_share_of_the_nodes_gpus(local_id, want):
    r = assign_slurm(dict(SLURM, SLURM_LOCALID=local_id), "worker", ["0", "1", "2", "3"])
    assert r.gpus == want and r.threads == 6


def test_under_slurm_a_ps_gets_no_gpu_and_gpus_bound_per_task_by_slurm_are_kept():
    assert assign_slurm(dict(SLURM, SLURM_LOCALID="1"), "ps", ["0", "1", "2", "3"]).gpus == ()
    # srun --gpus-per-task=1 leaves one GPU in each task's CUDA_VISIBLE_DEVICES: nothing to split.
    assert assign_slurm(dict(SLURM, SLURM_LOCALID="1"), "worker", ["3"]).gpus is None


# ------------------------------------------------------------------ a real run
def test_a_local_run_with_four_fake_gpus_gives_each_task_its_gpus_and_threads(tmp_path):
    # The launcher inherits CUDA_VISIBLE_DEVICES=0,1,2,3, as on a machine with four GPUs. With
    # --legacy-flags the ps runs the script too, so every task prints what it got.
    env = base_env(CUDA_VISIBLE_DEVICES="0,1,2,3", ROLES_MARKS=str(tmp_path), ROLES_WAIT_FOR="ps-0")
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
        env.pop(name, None)
    r = run_cli("local", "--ps", "1", "--workers", "2", "--legacy-flags", "--no-isolate", "--",
                sys.executable, os.path.join(SCRIPTS, "roles.py"), cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    got = {line.split("]")[0][1:]: json.loads(line.split(" RESOURCES ", 1)[1])
           for line in r.stdout.splitlines() if " RESOURCES " in line}
    cores = len(os.sched_getaffinity(0))
    share = str(max(1, (cores - 1) // 2))
    threads = {"TF_NUM_INTRAOP_THREADS": share, "TF_NUM_INTEROP_THREADS": "2",
               "OMP_NUM_THREADS": share, "TF_FORCE_GPU_ALLOW_GROWTH": None}
    assert got == {
        "worker:0": dict(threads, CUDA_VISIBLE_DEVICES="0,1"),
        "worker:1": dict(threads, CUDA_VISIBLE_DEVICES="2,3"),
        "ps:0": {"CUDA_VISIBLE_DEVICES": "", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2",
                 "OMP_NUM_THREADS": "1", "TF_FORCE_GPU_ALLOW_GROWTH": None},
    }
    line = next(x for x in r.stdout.splitlines() if x.startswith("[tfcluster] devices: "))
    assert line.startswith(f"[tfcluster] devices: 4 GPU(s) (CUDA_VISIBLE_DEVICES=0,1,2,3), {cores} core(s): ")
    assert "worker:0 GPU 0,1" in line and "worker:1 GPU 2,3" in line and "ps:0 no GPU, 1 thread" in line


def test_more_gpus_per_worker_than_the_machine_has_is_refused_before_anything_starts(tmp_path):
    r = run_cli("local", "--workers", "2", "--gpus-per-worker", "3", "--", sys.executable, "-c", "pass",
                cwd=str(tmp_path), env=base_env(CUDA_VISIBLE_DEVICES="0,1,2,3"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["tfcluster: error: --gpus-per-worker 3 for 2 trainer(s) needs 6 GPUs; 4 listed "
                                     "(CUDA_VISIBLE_DEVICES=0,1,2,3)"]
    assert os.listdir(tmp_path) == []


def test_start_under_slurm_gives_the_command_its_local_ids_share_of_the_gpus(tmp_path):
    # Two tasks on one node with four GPUs; this is the second (SLURM_LOCALID 1): GPUs 2,3, as
    # SlurmClusterResolver shares them, and SLURM_CPUS_PER_TASK threads.
    env = base_env(SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2", SLURM_PROCID="1",
                   SLURM_LOCALID="1", SLURM_CPUS_PER_TASK="3", CUDA_VISIBLE_DEVICES="0,1,2,3")
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"):
        env.pop(name, None)
    r = run_cli("start", "--slurm", "--", sys.executable, "-c",
                "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['TF_NUM_INTRAOP_THREADS'])",
                cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["2,3 3"]
    assert "tfcluster: worker:1 gets GPU 2,3, 3 threads (Slurm: SLURM_LOCALID 1, 4 GPU(s) from " \
           "CUDA_VISIBLE_DEVICES=0,1,2,3)" in r.stderr
