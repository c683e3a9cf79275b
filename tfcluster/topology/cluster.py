"""Where every task of a cluster lives: one immutable, validated description.

A :class:`Cluster` maps job names to lists of ``host:port`` addresses and
optionally names the task this process plays. Any job name is accepted, as
``tf.train.ClusterSpec`` accepts it (the tutorials' first cluster is one job
called ``local``); five names have a role (:data:`ROLES`): ``chief`` and its
TF 1.x spelling ``master`` initialise and checkpoint, ``worker`` trains, ``ps``
holds variables, and the ``evaluator`` runs outside the cluster (a TF_CONFIG
that lists it, as Kubeflow's TFJob does, has it set aside). It is
built from TF_CONFIG, JSON files, host lists, legacy flags, Slurm's environment
or local counts, and rendered back to ``tf.train.ClusterSpec``, TF_CONFIG,
legacy flags and a per-task ``ConfigProto``.

This module never imports TensorFlow at import time, so the CLI stays fast.
"""

import enum
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

from ..core.checks import whole_number
from ..core.errors import SpecError
from .tfconfig import names_a_cluster, read_layout

#: The jobs with a role, in the order tasks are listed (other jobs follow, by name).
CLUSTER_JOBS = ("chief", "master", "worker", "ps")
#: Jobs whose tasks train: ``master`` is TF 1.x's (and Estimator's) name for the chief.
TRAINER_JOBS = ("chief", "master", "worker")
#: The jobs of a process's task that have a role. The evaluator is a role but never a
#: cluster job: a session waits for every task in its ClusterSpec, so an evaluator
#: listed there makes everybody wait for it (kubeflow/trainer#1139).
TASK_TYPES = CLUSTER_JOBS + ("evaluator",)


class Role(enum.StrEnum):
    """What a task does, whatever its job is called (``master`` is TF 1.x's name for the chief)."""

    CHIEF = "chief"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"

    @property
    def trains(self) -> bool:
        """True for the roles that take a replica of the model: the chief and the workers."""
        return self in (Role.CHIEF, Role.WORKER)


class LegacyFlags(enum.StrEnum):
    """Which of TF 1.x's command-line flags a task's command gets (:meth:`Cluster.legacy_flags`)."""

    ALL = "all"                 # --job_name --task_index --ps_hosts --worker_hosts
    JOB_TASK = "job-task"       # --job_name --task_index (the cluster from TF_CONFIG)
    NONE = "none"               # TF_CONFIG only

    @classmethod
    def parse(cls, style, where: str = "legacy flags", params=()) -> "LegacyFlags":
        """``style`` as a :class:`LegacyFlags`; one line naming the three styles when it is none of them."""
        try:
            return cls(style)
        except ValueError:
            raise SpecError(f"{where}: unknown style {style!r}; use all, job-task or none", params=params) from None


#: What each named job does; a job not named here (``local``) has no role.
ROLES = {"chief": Role.CHIEF, "master": Role.CHIEF, "worker": Role.WORKER, "ps": Role.PS,
         "evaluator": Role.EVALUATOR}
_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
#: A TF device name's task: ``/job:ps/replica:0/task:1/device:CPU:0``, ``/job:ps/task:1``, ``/job:ps``.
_DEVICE_TASK = re.compile(r"/job:([^/]+)(?:/replica:\d+)?(?:/task:(\d+))?")
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "ip6-localhost"}


@dataclass(frozen=True, order=True)
class Task:
    """One task of a cluster: a job name and an index into that job."""

    job: str
    index: int

    @property
    def role(self) -> Optional[Role]:
        """What this task does (:class:`Role`), or None for a job with no role (``local``)."""
        return ROLES.get(self.job)

    @property
    def trains(self) -> bool:
        """True for the chief (or master) and the workers: the tasks that take a replica of the model."""
        return self.job in TRAINER_JOBS

    @property
    def ends_the_run(self) -> bool:
        """True for the tasks whose exit ends a run: the trainers, and the jobs of no role (TF 1.x's
        in-graph ``local`` runs the program); a ps serves them and the evaluator follows them."""
        return self.role not in (Role.PS, Role.EVALUATOR)

    @classmethod
    def of_device(cls, device: Optional[str]) -> Optional["Task"]:
        """The task a TensorFlow device name is on, or None where it names no job (a local device).

        ``/job:ps/replica:0/task:1/device:CPU:0`` and ``/job:ps/task:1`` are ps:1; ``/job:ps`` names no
        task, and TF places it on the job's first: ps:0. The one home of "which task is this device on",
        for the launcher too (no TensorFlow import).
        """
        m = _DEVICE_TASK.search(device or "")
        return None if m is None else cls(m.group(1), int(m.group(2) or 0))

    @property
    def device(self) -> str:
        """The TensorFlow device prefix of this task, e.g. ``/job:ps/task:0``."""
        return f"/job:{self.job}/task:{self.index}"

    def __str__(self) -> str:
        return f"{self.job}:{self.index}"


def parse_address(text: str, where: str = "address") -> tuple:
    """Split ``host:port`` (or ``[v6]:port``) into a validated (host, port)."""
    if not isinstance(text, str):
        raise SpecError(f"{where}: expected a 'host:port' string, got {text!r}")
    addr = text.strip()
    if addr.startswith("grpc://"):
        addr = addr[len("grpc://"):]
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\S+)|([^\s:/\[\]]+):(\S+)", addr)
    if not m:
        raise SpecError(f"{where}: {text!r} is not of the form host:port")
    host = m.group(1) or m.group(3)
    port_text = m.group(2) or m.group(4)
    if not port_text.isdigit():
        raise SpecError(f"{where}: port {port_text!r} in {text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise SpecError(f"{where}: port {port} in {text!r} is out of range 1-65535")
    return host, port


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine's loopback interface."""
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _identity(address: str) -> tuple:
    host, port = parse_address(address)
    # localhost and 127.0.0.1 are one socket; two tasks on them would clash.
    return ("loopback" if is_loopback(host) else host.lower(), port)


def _split_hosts(value, where: str, params=()) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        items = [v for v in (p.strip() for p in value.split(",")) if v]
        if not items:
            raise SpecError(f"{where}: empty host list {value!r}", params=params)
        return tuple(items)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise SpecError(f"{where}: expected a list of 'host:port' strings, got {type(value).__name__}", params=params)


def _validated_jobs(jobs) -> dict:
    """The jobs, checked (known jobs, valid and distinct addresses, someone to train) and in job order."""
    if not isinstance(jobs, Mapping):
        raise SpecError(f"cluster: expected an object of job -> addresses, got {type(jobs).__name__}")
    clean = {}
    for job, addrs in jobs.items():
        if job == "evaluator":
            raise SpecError(
                "cluster: 'evaluator' must not be listed in the cluster, or every session waits "
                "for it; run it as task type 'evaluator' outside the cluster (tfcluster local --evaluator)")
        if not isinstance(job, str) or not _JOB_NAME.fullmatch(job):
            raise SpecError(f"cluster: job name {job!r} is not a name (letters, digits, '_' or '-', a letter "
                            "first)")
        addrs = _split_hosts(addrs, f"job {job!r}")
        if not addrs:
            raise SpecError(f"cluster: job {job!r} has no tasks")
        for i, a in enumerate(addrs):
            parse_address(a, f"{job}:{i}")
        # TF's ClusterSpec wants bare host:port; a grpc:// prefix would reach its bind.
        clean[job] = tuple(a.strip()[len("grpc://"):] if a.strip().startswith("grpc://") else a.strip()
                           for a in addrs)
    if not clean:
        raise SpecError("cluster: no jobs; a cluster needs at least one worker or chief")
    if set(clean) <= {"ps"}:
        raise SpecError("cluster: no 'worker' or 'chief' job; nobody would train")
    chiefs = [j for j in ("chief", "master") if j in clean]
    if len(chiefs) > 1:
        raise SpecError("cluster: both 'chief' and 'master' jobs; they are one role (master is TF 1.x's name "
                        "for the chief), so give one")
    for job in chiefs:
        if len(clean[job]) > 1:
            raise SpecError(f"cluster: job {job!r} has {len(clean[job])} tasks; it takes exactly one")
    order = [j for j in CLUSTER_JOBS if j in clean] + sorted(j for j in clean if j not in CLUSTER_JOBS)
    seen = {}
    for job in order:
        for i, a in enumerate(clean[job]):
            key = _identity(a)
            if key in seen:
                first, first_addr = seen[key]
                if first_addr == a:
                    raise SpecError(f"cluster: duplicate address {a} for {first} and {job}:{i}")
                raise SpecError(f"cluster: duplicate address: {first} at {first_addr} and {job}:{i} at {a} "
                                "are the same socket")
            seen[key] = (f"{job}:{i}", a)
    return {job: clean[job] for job in order}


def _validated_task(jobs, task) -> Task:
    """``task`` as a Task of ``jobs`` (or the evaluator, outside them), checked."""
    if isinstance(task, tuple) and not isinstance(task, Task):
        task = Task(*task)
    job, index = task.job, task.index
    if not isinstance(job, str) or (job not in TASK_TYPES and job not in jobs):
        raise SpecError(f"task: unknown job {job!r}; this cluster's jobs are {', '.join(jobs)} "
                        "(and the evaluator, outside it)")
    if isinstance(index, bool) or not isinstance(index, int):
        try:
            index = int(str(index))
        except ValueError:
            raise SpecError(f"task: index {index!r} of job {job!r} is not a whole number") from None
    if job == "evaluator":
        if index != 0:
            raise SpecError(f"task: evaluator index {index} is out of range; there is one evaluator, index 0")
    elif job not in jobs:
        raise SpecError(f"task: job {job!r} is not in the cluster (jobs: {', '.join(jobs)})")
    elif not 0 <= index < len(jobs[job]):
        raise SpecError(
            f"task: index {index} is out of range for job {job!r}, "
            f"which has {len(jobs[job])} task(s): 0-{len(jobs[job]) - 1}")
    return Task(job, index)


@dataclass(frozen=True)
class Cluster:
    """An immutable, validated cluster: jobs to addresses, plus this process's task."""

    jobs: Mapping[str, tuple]
    task: Optional[Task] = None

    def __post_init__(self):
        object.__setattr__(self, "jobs", MappingProxyType(_validated_jobs(self.jobs)))
        if self.task is not None:
            object.__setattr__(self, "task", _validated_task(self.jobs, self.task))

    # ------------------------------------------------------------------ sources
    @classmethod
    def from_dict(cls, data, where: str = "cluster spec") -> "Cluster":
        """Build from a TF_CONFIG-shaped dict (as Kubeflow's TFJob writes it too), or a bare cluster dict.

        An evaluator listed in it is set aside, outside the cluster (:mod:`tfcluster.topology.tfconfig`).
        """
        layout = read_layout(data, where)
        try:
            for i, address in enumerate(layout.evaluator):
                parse_address(address, f"evaluator:{i}")
            return cls(layout.jobs, layout.task)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None

    @classmethod
    def from_json(cls, text: str, where: str = "cluster spec") -> "Cluster":
        """Parse JSON text in the TF_CONFIG shape or the bare cluster shape."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecError(f"{where}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        return cls.from_dict(data, where)

    @classmethod
    def from_file(cls, path: str) -> "Cluster":
        """Read a cluster JSON file (TF_CONFIG shape or bare cluster dict)."""
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise SpecError(f"cannot read cluster file {path}: {e.strerror}") from None
        return cls.from_json(text, where=path)

    @classmethod
    def from_tf_config(cls, environ: Optional[Mapping] = None) -> "Cluster":
        """Read the TF_CONFIG environment variable (Kubeflow, SageMaker, tf.distribute)."""
        env = os.environ if environ is None else environ
        text = env.get("TF_CONFIG")
        if not text:
            raise SpecError("TF_CONFIG is not set; start this script with tfcluster start/local, or set TF_CONFIG")
        return cls.from_json(text, where="TF_CONFIG")

    @classmethod
    def from_environment(cls, environ: Optional[Mapping] = None) -> Optional["Cluster"]:
        """TF_CONFIG's cluster and task; None when it is unset or names no cluster (one process, as in TF 1.x).

        The one way every part of tfcluster finds its cluster in the environment.
        """
        text = (os.environ if environ is None else environ).get("TF_CONFIG")
        return cls.from_json(text, where="TF_CONFIG") if text and names_a_cluster(text) else None

    @classmethod
    def from_hosts(cls, ps=None, worker=None, chief=None, job=None, task=None) -> "Cluster":
        """Build from host lists (``"h:p,h:p"`` or lists) and an optional job/task."""
        jobs = {}
        for name, value in (("chief", chief), ("worker", worker), ("ps", ps)):
            hosts = _split_hosts(value, f"{{{name}}}", params=[name])
            if value is not None:
                jobs[name] = hosts
        if (job is None) != (task is None):
            raise SpecError("{job} and {task} go together; give both or neither", params=["job", "task"])
        return cls(jobs, None if job is None else (job, task))

    @classmethod
    def from_slurm(cls, environ: Optional[Mapping] = None, ps: int = 0, port_base: int = 8888) -> "Cluster":
        """Build from Slurm's environment, as TF's SlurmClusterResolver does (see :mod:`tfcluster.topology.slurm`)."""
        from .slurm import slurm_layout
        jobs, task = slurm_layout(os.environ if environ is None else environ, ps=ps, port_base=port_base)
        return cls(jobs, task)

    @classmethod
    def local(cls, ps: int = 0, workers: int = 1, chief: bool = False, host: str = "localhost",
              ports=None, base_port: Optional[int] = None) -> "Cluster":
        """A cluster on one host: explicit ports, consecutive from base_port, or free ones."""
        whole_number("ps", ps)
        whole_number("workers", workers)
        if workers == 0 and not chief:
            raise SpecError("{workers} 0 leaves nobody to train; give {workers} 1 or more (or {chief})",
                            params=["workers", "chief"])
        total = ps + workers + int(chief)
        if ports is None:
            if base_port is not None:
                if not 1 <= base_port <= 65535 - total + 1:
                    raise SpecError(f"{{base_port}} {base_port} leaves no room for {total} ports below 65536",
                                    params=["base_port"])
                ports = list(range(base_port, base_port + total))
            else:
                from .ports import pick_free_ports
                ports = pick_free_ports(total, host)
        ports = list(ports)
        if len(ports) != total:
            raise SpecError(f"{total} task(s) need {total} ports, got {len(ports)}")
        fmt = f"[{host}]:{{}}" if ":" in host else f"{host}:{{}}"
        it = iter(ports)
        jobs = {}
        if chief:
            jobs["chief"] = [fmt.format(next(it))]
        if workers:
            jobs["worker"] = [fmt.format(next(it)) for _ in range(workers)]
        if ps:
            jobs["ps"] = [fmt.format(next(it)) for _ in range(ps)]
        return cls(jobs)

    # -------------------------------------------------------------------- views
    def with_task(self, job: str, index) -> "Cluster":
        """The same cluster, seen from task (job, index)."""
        return Cluster(self.jobs, (job, index))

    def tasks(self, jobs=None):
        """Every task of the cluster (or of the given jobs), chief first, ps last."""
        return [Task(j, i) for j in self.jobs if jobs is None or j in jobs for i in range(len(self.jobs[j]))]

    def address(self, task: Task) -> str:
        """The host:port of a task."""
        return self.jobs[task.job][task.index]

    def hosts(self, job: str) -> set:
        """The machines a job's tasks run on (``localhost`` and ``127.0.0.1`` are one)."""
        return {_identity(a)[0] for a in self.jobs.get(job, ())}

    def num_tasks(self, job: str) -> int:
        """How many tasks a job has (0 for an absent job)."""
        return len(self.jobs.get(job, ()))

    def trainers(self) -> list:
        """The tasks that train, the chief (or master) first."""
        return self.tasks(TRAINER_JOBS)

    @property
    def num_replicas(self) -> int:
        """Tasks that train: the workers plus the chief (or master)."""
        return len(self.trainers())

    def role(self, task: Optional[Task] = None) -> Optional[Role]:
        """What ``task`` (this process's by default) does, or None for a job with no role (``local``)."""
        return self.this_task(task).role

    @property
    def chief_task(self) -> Optional[Task]:
        """The task that initialises and checkpoints: the chief (or master), else worker 0."""
        trainers = self.trainers()
        return trainers[0] if trainers else None

    @property
    def is_chief(self) -> bool:
        """True for the task that initialises and checkpoints (chief or master, else worker 0)."""
        return self.this_task() == self.chief_task

    def needed_tasks(self, task: Optional[Task] = None):
        """The tasks that ``task`` must reach to run a session: ps tasks for trainers."""
        return self.tasks(("ps",)) if self.this_task(task).trains else []

    def this_task(self, task: Optional[Task] = None) -> Task:
        """``task`` when given, else this process's task; one line when the cluster names none."""
        if task is not None:
            return task
        if self.task is None:
            raise SpecError("no task given: name this process's job and task (--job/--task or TF_CONFIG)")
        return self.task

    # ------------------------------------------------------------------ renders
    def as_dict(self) -> dict:
        """The bare cluster dict, ``{"worker": [...], "ps": [...]}``."""
        return {j: list(a) for j, a in self.jobs.items()}

    def to_cluster_spec(self):
        """Render as a ``tf.train.ClusterSpec`` (imports TensorFlow)."""
        import tensorflow as tf
        return tf.train.ClusterSpec(self.as_dict())

    def tf_config(self, task: Optional[Task] = None) -> str:
        """Render TF_CONFIG JSON for a task (this process's task by default)."""
        t = _validated_task(self.jobs, task) if task is not None else self.this_task()
        return json.dumps({"cluster": self.as_dict(), "task": {"type": t.job, "index": t.index}},
                          separators=(",", ":"))

    def to_json(self) -> str:
        """Pretty JSON of the bare cluster dict, for a cluster file."""
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def legacy_flags(self, task: Optional[Task] = None, style: str = LegacyFlags.ALL) -> list:
        """The TF1 flags ``--job_name --task_index [--ps_hosts --worker_hosts]`` a :class:`LegacyFlags` style gives."""
        style = LegacyFlags.parse(style)
        t = _validated_task(self.jobs, task) if task is not None else self.this_task()
        if style is LegacyFlags.NONE:
            return []
        flags = [f"--job_name={t.job}", f"--task_index={t.index}"]
        if style is LegacyFlags.ALL:
            flags += [f"--ps_hosts={','.join(self.jobs.get('ps', ()))}",
                      f"--worker_hosts={','.join(self.jobs.get('worker', ()))}"]
        return flags

    def device_filters(self, task: Optional[Task] = None) -> list:
        """Devices a task's sessions may see: trainers see the ps tasks and themselves.

        Without filters every session contacts every task, so one missing or
        slow worker blocks all the others (tensorflow/tensorflow#21629).
        """
        t = self.this_task(task)
        if t.trains:
            return (["/job:ps"] if "ps" in self.jobs else []) + [t.device]
        if t.role is Role.PS:
            return [t.device]
        return []       # a job with no role may run in-graph over every task

    def shares_machine(self, task: Optional[Task] = None) -> bool:
        """True when another task of the cluster runs on ``task``'s machine (the same host), sharing its cores."""
        t = self.this_task(task)
        if t.job not in self.jobs:
            return False
        here = _identity(self.address(t))[0]
        return sum(_identity(self.address(o))[0] == here for o in self.tasks()) > 1

    def session_config(self, task: Optional[Task] = None, **overrides):
        """A ``ConfigProto`` for a task: device filters and soft placement on, and thread pools that sleep when idle
        where the task shares its machine with other tasks (:meth:`shares_machine`)."""
        import tensorflow as tf
        t = self.this_task(task)
        config = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_filters=self.device_filters(t))
        # TF's pools spin for new work before they sleep: a spinning thread holds a core another task's op waits
        # for (docs/embeddings.md, "A step at the speed of its arithmetic": the click-through step 1.07x).
        config.experimental.disable_thread_spinning = self.shares_machine(t)
        for k, v in overrides.items():
            setattr(config, k, v)
        return config

    def describe(self) -> str:
        """One line per task: ``worker:0  localhost:2223``."""
        return "\n".join(f"{str(t):<10} {self.address(t)}" for t in self.tasks())
