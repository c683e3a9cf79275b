"""Which GPUs and how many CPU threads each task gets, so the tasks of one machine do not fight over them.

Left alone, every task sees every GPU, and TensorFlow takes the memory of all
of them in each process, the ps included (docs/pitfalls.md, item 8); and each
task sizes its thread pools to every core, so three tasks on two cores run
three times as many busy threads as there are cores.

GPUs are listed without TensorFlow (:func:`list_gpus`): the
``CUDA_VISIBLE_DEVICES`` the launcher inherited, when it is set (the GPUs it
may hand out, in that order), else ``nvidia-smi -L``; none when neither says.

``tfcluster local`` (:func:`assign_local`):

- a worker or the chief gets GPUs of its own: ``gpus_per_worker`` each, by
  default the listed GPUs split evenly among the trainers. With fewer GPUs
  than trainers each trainer gets one, shared in turn, with
  ``TF_FORCE_GPU_ALLOW_GROWTH=true`` so that no task takes a whole GPU's memory;
- a ps gets none (``CUDA_VISIBLE_DEVICES=""``); the evaluator gets GPUs left
  over by the split, else none;
- threads: the cores (this process's CPU affinity), less one for each ps and
  the evaluator, split evenly among the trainers; a ps and the evaluator get
  one. ``threads_per_task=N`` gives every task N, 0 leaves TensorFlow's
  defaults. They are set as ``TF_NUM_INTRAOP_THREADS``,
  ``TF_NUM_INTEROP_THREADS`` (two, whatever the share: with one, an op that waits
  for another op of its process blocks the only thread, and TF 2's
  ParameterServerStrategy hangs for good; measured in docs/tf2.md) and
  ``OMP_NUM_THREADS``; a value the user exported is kept, unless
  ``threads_per_task`` says otherwise.

Under Slurm (``tfcluster start --slurm``, :func:`assign_slurm`), as TF's
SlurmClusterResolver: a node's GPUs are split evenly among its tasks (the most
tasks any node runs), and the task with ``SLURM_LOCALID`` k takes the k-th
share; a ps takes none; threads follow ``SLURM_CPUS_PER_TASK`` when it is set.
"""

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Mapping, MutableMapping, Optional, Sequence, Tuple

from ..core.checks import whole_number
from ..core.errors import SpecError
from .cluster import ROLES, Role

GPU_ENV = "CUDA_VISIBLE_DEVICES"
GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"
INTRA_ENV, INTER_ENV, OMP_ENV = "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS"
#: Ops a task runs side by side: two, never one (one deadlocks an op that waits for another; see the module).
INTER_OP_THREADS = 2
#: Tasks that serve, not compute: every other job (chief, master, worker, a job of no role) gets a GPU share.
SERVING = ("ps", "evaluator")
_SMI_TIMEOUT = 10.0


@dataclass(frozen=True)
class Resources:
    """What one task gets: its GPUs (None: as inherited) and its threads (None: TensorFlow's defaults).

    ``shared``: its GPU is shared with other tasks. ``forced``: its threads
    replace any the user exported.
    """

    gpus: Optional[Tuple[str, ...]] = None
    threads: Optional[int] = None
    shared: bool = False
    forced: bool = False

    def apply(self, env: MutableMapping) -> MutableMapping:
        """Set these resources in a task's environment ``env``; returns ``env``."""
        if self.gpus is not None:
            env[GPU_ENV] = ",".join(self.gpus)
            if self.shared:
                env.setdefault(GROWTH_ENV, "true")
        if self.threads:
            for name, n in ((INTRA_ENV, self.threads), (INTER_ENV, INTER_OP_THREADS), (OMP_ENV, self.threads)):
                if self.forced:
                    env[name] = str(n)
                else:
                    env.setdefault(name, str(n))
        return env

    def describe(self) -> str:
        """``GPU 0,1, 3 threads``, ``no GPU, 1 thread`` or ``as inherited``."""
        parts = []
        if self.gpus is not None:
            parts.append("GPU " + ",".join(self.gpus) + (" (shared)" if self.shared else "") if self.gpus
                         else "no GPU")
        if self.threads:
            parts.append(f"{self.threads} thread{'s' if self.threads > 1 else ''}")
        return ", ".join(parts) or "as inherited"


def _smi(argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=_SMI_TIMEOUT)


def list_gpus(environ: Optional[Mapping] = None, run: Callable = _smi) -> Tuple[list, str]:
    """``(GPU ids, where the list came from)``: ``CUDA_VISIBLE_DEVICES`` when set, else ``nvidia-smi -L``.

    ``run`` runs a command and returns a CompletedProcess (a test passes its own).
    """
    env = os.environ if environ is None else environ
    if GPU_ENV in env:
        value = env[GPU_ENV]
        ids = []
        for x in (x.strip() for x in value.split(",")):
            if not x or x.startswith("-"):     # CUDA stops at the first invalid id ("-1": none)
                break
            ids.append(x)
        return ids, f"{GPU_ENV}={value!s}"
    try:
        out = run(["nvidia-smi", "-L"])
    except FileNotFoundError:
        return [], "nvidia-smi not found"
    except subprocess.TimeoutExpired:
        return [], f"nvidia-smi did not answer within {_SMI_TIMEOUT:g}s"
    except OSError as e:
        return [], f"nvidia-smi: {e.strerror}"
    if out.returncode != 0:
        return [], f"nvidia-smi exited with code {out.returncode}"
    return re.findall(r"^GPU (\d+):", out.stdout, re.M), "nvidia-smi -L"


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _split_gpus(n_trainers: int, gpus: Sequence[str], per: Optional[int], source: str):
    """``([trainer's Resources-kwargs], the evaluator's GPUs)``."""
    if per is None and not gpus:
        return [dict()] * n_trainers, None
    if per is None and len(gpus) < n_trainers:
        return [dict(gpus=(gpus[i % len(gpus)],), shared=True) for i in range(n_trainers)], ()
    if per is None:
        per = len(gpus) // n_trainers
    elif per * n_trainers > len(gpus):
        raise SpecError(f"{{gpus_per_worker}} {per} for {n_trainers} trainer(s) needs {per * n_trainers} GPUs; "
                        f"{len(gpus)} listed ({source})", params=["gpus_per_worker"])
    shares = [dict(gpus=tuple(gpus[i * per:(i + 1) * per])) for i in range(n_trainers)]
    return shares, tuple(gpus[n_trainers * per:][:per])


def assign_local(tasks, gpus: Sequence[str], cores: int, gpus_per_worker: Optional[int] = None,
                 threads_per_task: Optional[int] = None, source: str = "the GPU list") -> dict:
    """``{task: Resources}`` for the tasks of a local cluster (rules in the module doc)."""
    whole_number("gpus_per_worker", gpus_per_worker, optional=True)
    whole_number("threads_per_task", threads_per_task, optional=True)
    trainers = [t for t in tasks if t.job not in SERVING]
    helpers = [t for t in tasks if t.job in SERVING]
    shares, evaluator_gpus = _split_gpus(len(trainers), list(gpus), gpus_per_worker, source)
    if threads_per_task == 0:
        trainer_threads = helper_threads = None
    elif threads_per_task:
        trainer_threads = helper_threads = threads_per_task
    else:
        trainer_threads = max(1, (cores - len(helpers)) // max(1, len(trainers)))
        helper_threads = 1
    forced = threads_per_task is not None
    out = {t: Resources(threads=trainer_threads, forced=forced, **share) for t, share in zip(trainers, shares)}
    for t in helpers:
        mine = () if t.role is Role.PS else evaluator_gpus
        out[t] = Resources(gpus=mine, threads=helper_threads, forced=forced)
    return out


def assign_slurm(environ: Mapping, job: str, gpus: Sequence[str]) -> Resources:
    """This Slurm task's Resources: its ``SLURM_LOCALID`` share of the node's GPUs, as SlurmClusterResolver."""
    from .slurm import expand_hostlist, expand_tasks_per_node
    cpus = environ.get("SLURM_CPUS_PER_TASK", "")
    threads = int(cpus) if cpus.isdigit() and int(cpus) > 0 else None
    if ROLES.get(job) is Role.PS:
        return Resources(gpus=(), threads=threads)
    local_id = environ.get("SLURM_LOCALID", "")
    try:
        hosts = expand_hostlist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "")
        per_node = expand_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE")
                                         or environ.get("SLURM_TASKS_PER_NODE") or "", len(hosts))
    except SpecError:
        return Resources(threads=threads)
    per = len(gpus) // max(per_node)
    if not local_id.isdigit() or per == 0:
        # No GPUs, or Slurm already bound fewer GPUs to this task than the node has tasks: keep them.
        return Resources(threads=threads)
    k = int(local_id)
    mine = tuple(gpus[k * per:(k + 1) * per])
    return Resources(gpus=mine, threads=threads) if mine else Resources(threads=threads)
