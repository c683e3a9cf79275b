"""What a local launch is asked to do: one frozen, validated :class:`LaunchConfig`.

Everything that can be refused is refused here, before any process starts or
any file is made, in one line that names the parameter (``max_restarts must
be ...``; the CLI shows the flag instead, :class:`~tfcluster.core.errors.TfclusterError`).
"""

import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional, Tuple, Union

from ..core.checks import seconds, whole_number
from ..core.errors import SpecError
from ..runtime.preemption import STOP_GRACE_SECS
from ..topology.cluster import Cluster, LegacyFlags, is_loopback, parse_address
from ..topology.taskenv import new_run_id, run_id
from .memory import parse_size

#: Seconds the evaluator may run on after the trainers are done (``--evaluator-grace``).
EVALUATOR_GRACE_SECS = 60.0


@dataclass(frozen=True)
class LaunchConfig:
    """A local cluster to run: its tasks, the command they run, and how they are supervised.

    - ``command``: what workers, the chief and the evaluator run (and, with
      ``legacy_flags``, the ps too).
    - ``ps``, ``workers``, ``chief``, ``evaluator``: the tasks, on ``host`` with
      free ports, unless ``cluster`` gives them (scripts with hard-coded ports).
    - ``legacy_flags``: a :class:`~tfcluster.topology.cluster.LegacyFlags` style, ``"all"``, ``"job-task"``
      or ``"none"`` (TF1's flags).
    - ``log_dir``: one log per task (None: ``./tfcluster-logs/<time>``).
    - ``timeout``: stop everything after this many seconds (exit 124).
    - ``max_restarts``: restarts of a task that crashes.
    - ``evaluator_grace``: seconds the evaluator may run on after the trainers.
    - ``join_grace``: seconds after the chief finished before trainers still
      running are taken to be left in ``server.join()`` and stopped.
    - ``stop_grace``: seconds each task has, after SIGTERM, before SIGKILL: a
      trainer finishes its step and writes its checkpoint (preemption.py).
    - ``isolate``: run the cluster in its own loopback-only network namespace;
      ``require_isolation``: stop before any task starts when it cannot be
      (the default runs the cluster exposed, saying so in one line).
    - ``subreaper``: adopt the tasks' orphans so that none outlives the run
      (children the calling process had before the run are never touched).
    - ``verbose``: TensorFlow's C++ logs and the launcher's debug lines.
    - ``env``: more variables for every task's environment.
    - ``gpus_per_worker``: GPUs of each worker and the chief (None: the listed
      GPUs split evenly); ``threads_per_task``: every task's thread pools (None:
      the cores split among the trainers, 0: TensorFlow's defaults). See
      :mod:`tfcluster.topology.devices`.
    - ``timestamps``: each line shown starts with the time it arrived.
    - ``ps_memory``: each ps task's memory limit, in bytes or as ``1500M``, ``1.5G`` (None: no limit): each
      runs in a memory cgroup of its own (needs root; :mod:`.memory`), and a ps the kernel kills for
      memory is named as such.
    - ``fork_tf1``: TF1-mode tasks (``python -m tfcluster.tf1 SCRIPT``) are forked from one process that
      imported TensorFlow once (:mod:`.forked`) instead of each importing it.
    - ``run_id``: the run's id (None: Slurm's job, else a new one); a Keras fit's default checkpoint dir
      is the run's, so the id of a stopped run resumes it.
    """

    command: Tuple[str, ...]
    ps: int = 1
    workers: int = 2
    chief: bool = False
    evaluator: bool = False
    legacy_flags: str = "none"
    log_dir: Optional[str] = None
    timeout: Optional[float] = None
    max_restarts: int = 0
    evaluator_grace: float = EVALUATOR_GRACE_SECS
    verbose: bool = False
    host: str = "localhost"
    cluster: Optional[Cluster] = None
    join_grace: Optional[float] = None
    stop_grace: float = STOP_GRACE_SECS
    isolate: bool = False
    require_isolation: bool = False
    subreaper: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    gpus_per_worker: Optional[int] = None
    threads_per_task: Optional[int] = None
    timestamps: bool = False
    run_id: Optional[str] = None
    ps_memory: Optional[Union[int, str]] = None
    fork_tf1: bool = True

    def __post_init__(self):
        object.__setattr__(self, "command", tuple(self.command))
        # One id per launch (or the one given, or Slurm's job): every task's, kept when one is restarted.
        object.__setattr__(self, "run_id", self.run_id or run_id() or new_run_id())
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if self.cluster is not None:
            # An explicit cluster (scripts with hard-coded ports): its jobs decide the counts.
            # Any job name (TF 1.x's ClusterSpec): a chief or master counts as the chief, every other
            # non-ps job's tasks as workers, each running the command.
            c = self.cluster
            chiefs = c.num_tasks("chief") + c.num_tasks("master")
            object.__setattr__(self, "ps", c.num_tasks("ps"))
            object.__setattr__(self, "workers", len(c.tasks()) - self.ps - chiefs)
            object.__setattr__(self, "chief", bool(chiefs))
            check_local(c)
        else:
            check_host(self.host)
        self._check_numbers()
        object.__setattr__(self, "legacy_flags", LegacyFlags.parse(self.legacy_flags, "{legacy_flags}",
                                                                    params=["legacy_flags"]))
        if self.legacy_flags is LegacyFlags.ALL and self.chief:
            raise SpecError("{legacy_flags}=all has no chief host list (TF1 scripts make worker 0 the chief); "
                            "drop {chief}, or use {legacy_flags}=job-task with TF_CONFIG",
                            params=["legacy_flags", "chief"])
        if self.require_isolation and not self.isolate:
            raise SpecError("{require_isolation} asks for the isolation that {isolate} turns off; give one of them",
                            params=["require_isolation", "isolate"])
        check_command(self.command)

    def _check_numbers(self):
        for name in ("ps", "workers", "max_restarts", "gpus_per_worker", "threads_per_task"):
            whole_number(name, getattr(self, name), optional=name in ("gpus_per_worker", "threads_per_task"))
        if self.workers == 0 and not self.chief:
            raise SpecError("{workers} 0 leaves nobody to train; give {workers} 1 or more (or {chief})",
                            params=["workers", "chief"])
        seconds("timeout", self.timeout, optional=True)
        for name in ("evaluator_grace", "join_grace", "stop_grace"):
            seconds(name, getattr(self, name), positive=False, optional=True)
        object.__setattr__(self, "ps_memory", parse_size("ps_memory", self.ps_memory))
        if self.ps_memory is not None and not self.ps:
            raise SpecError("{ps_memory} limits the ps tasks' memory, and this cluster has no ps task",
                            params=["ps_memory"])

    @property
    def trainers_restart_together(self) -> bool:
        """True when a crashed trainer restarts with every trainer: trainers that all-reduce form one group, which
        takes no new member (docs/tf2.md, "Faults"). Several trainers and no ps do (Horovod, TF 1.x's
        MultiWorkerMirroredStrategy, tfcluster's collective strategy), and TF2 mode's trainers unless they have a
        chief and ps tasks (TF 2's ParameterServerStrategy, which takes a worker back alone)."""
        if self.ps == 0 and self.workers + int(self.chief) > 1:
            return True
        # The command as tfcluster.tf2's tf2_command rewrote it (the launcher imports no mode).
        return "tfcluster.tf2" in self.command and not (self.chief and self.ps)

    @property
    def total_tasks(self) -> int:
        """Tasks with a port: the ps tasks, the workers and the chief."""
        return self.ps + self.workers + int(self.chief)


def check_command(command):
    """Raise a one-line SpecError unless ``command`` can be started."""
    if not command:
        raise SpecError("no {command} to run", params=["command"])
    exe = command[0]
    if os.sep in exe:
        if not os.path.isfile(exe):
            raise SpecError(f"cannot run {exe!r}: no such file")
        if not os.access(exe, os.X_OK):
            raise SpecError(f"cannot run {exe!r}: not executable")
    elif shutil.which(exe, path=os.environ.get("PATH", os.defpath)) is None:
        raise SpecError(f"cannot run {exe!r}: not found on PATH")
    script = python_script(command)
    if script is not None and not os.path.isfile(script):
        # Otherwise every task would start (the ps loading TensorFlow) only for each worker to fail.
        raise SpecError(f"no such script: {script} (in {' '.join(command[:2])})")


def python_script(command) -> Optional[str]:
    """The script of ``python [options] script.py ...``; None for other commands, -m and -c."""
    if not re.fullmatch(r"python[\d.]*", os.path.basename(command[0])):
        return None
    args = iter(command[1:])
    for a in args:
        if a in ("-m", "-c", "-") or a.startswith(("-m", "-c")):
            return None
        if a in ("-W", "-X"):
            next(args, None)
        elif not a.startswith("-"):
            return a
    return None


def check_host(host: str):
    """Refuse a host that does not resolve or is not an address of this machine."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise SpecError(f"{{host}} {host!r} does not resolve", params=["host"]) from None
    for family, _, _, _, addr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return
            except OSError:
                continue
    raise SpecError(f"{{host}} {host} ({infos[0][4][0]}) is not an address of this machine; tfcluster local "
                    "runs every task here (use tfcluster start on each host instead)", params=["host"])


def check_local(cluster: Cluster):
    """Refuse an explicit cluster with a task that is not on this machine."""
    local_names = {"localhost", socket.gethostname(), socket.getfqdn()}
    for t in cluster.tasks():
        host, _ = parse_address(cluster.address(t))
        if not (is_loopback(host) or host in local_names):
            raise SpecError(f"{t} is at {cluster.address(t)}, not on this machine; tfcluster local runs "
                            "every task here (use tfcluster start on each host instead)")
