"""From a LaunchConfig to the tasks to start: the log dir, the ports held, the cluster, each task's command.

Every port is reserved at once and each stays held by a placeholder socket
(:mod:`tfcluster.topology.ports`) until its task's server answers, so nothing takes it
in between; the tasks get ``TF_GRPC_REUSE_PORT=1`` to bind it anyway.
"""

import datetime
import os
import sys

from ..core import environment
from ..core.errors import TfclusterError
from ..core.private import make_private_dir, open_private
from ..topology.cluster import Cluster, LegacyFlags, Role, Task, parse_address
from ..topology.devices import assign_local, cpu_cores, list_gpus
from ..topology.ports import PortReservation, hold_port, port_holder
from ..topology.taskenv import task_environment
from .config import LaunchConfig
from .processes import TaskProcess


#: In the log dir: the bytes the chief placed on each ps (graph/placement.py writes it, the launcher
#: reads it when a ps dies out of memory).
PS_STATE_FILE = "ps-state.json"


def make_log_dir(log_dir=None) -> str:
    """``log_dir``, or a new ``tfcluster-logs/<time>`` dir; made now, or one clear error."""
    if log_dir:
        path = log_dir
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = os.path.join("tfcluster-logs", stamp)
        n = 1
        while os.path.exists(path):
            n += 1
            path = os.path.join("tfcluster-logs", f"{stamp}-{n}")
    try:
        make_private_dir(path)      # task logs hold every task's argv: private.py
    except OSError as e:
        raise TfclusterError(f"cannot create log dir {path}: {e.strerror}") from None
    return path


def _reserve(config: LaunchConfig):
    """One reservation per task, each taken while the others are held, so the ports differ."""
    total = config.total_tasks
    held = []
    try:
        for _ in range(total):
            held.append(PortReservation(1, config.host))
    except OSError as e:
        for r in held:
            r.release()
        raise TfclusterError(f"cannot reserve {total} port(s) on {config.host}: {e.strerror}") from None
    return held


def _hold_explicit(cluster: Cluster) -> dict:
    """Hold the given ports of an explicit cluster as placeholders; one clear line if one is taken."""
    held = {}
    for t in cluster.tasks():
        host, port = parse_address(cluster.address(t))
        h = hold_port(port, host)
        if h is None:
            for x in held.values():
                x.release()
            who = port_holder(port)
            raise TfclusterError(f"port {port} of {t} ({cluster.address(t)}) is already in use"
                                 + (f" (held by {who})" if who else ""))
        held[port] = h
    return held


def hold_cluster(config: LaunchConfig):
    """``(cluster, {port: placeholder})``: the cluster's ports, every one held."""
    if config.cluster is not None:
        return config.cluster, _hold_explicit(config.cluster)
    held = _reserve(config)
    try:
        cluster = Cluster.local(ps=config.ps, workers=config.workers, chief=config.chief, host=config.host,
                                ports=[r.ports[0] for r in held])
    except TfclusterError:
        for r in held:
            r.release()
        raise
    return cluster, {r.ports[0]: r for r in held}


def _cluster_tasks(cluster: Cluster) -> list:
    """The ps tasks, then every other job's (chief or master first): TF 1.x clusters may name any job."""
    rest = [t for t in cluster.tasks() if t.ends_the_run]
    return cluster.tasks(("ps",)) + sorted(rest, key=lambda t: (t not in cluster.trainers()[:1],))


def planned_tasks(config: LaunchConfig) -> list:
    """The tasks a launch starts, in starting order: the ps tasks, the trainers, then the evaluator."""
    if config.cluster is not None:
        tasks = _cluster_tasks(config.cluster)
    else:
        tasks = ([Task("ps", i) for i in range(config.ps)] + ([Task("chief", 0)] if config.chief else [])
                 + [Task("worker", i) for i in range(config.workers)])
    return tasks + ([Task("evaluator", 0)] if config.evaluator else [])


def plan_resources(config: LaunchConfig, gpu_lister=list_gpus):
    """``({task: Resources}, one line saying who gets what)``: GPUs and threads per task (:mod:`tfcluster.topology.devices`)."""
    gpus, source = gpu_lister()
    cores = cpu_cores()
    assigned = assign_local(planned_tasks(config), gpus, cores, config.gpus_per_worker, config.threads_per_task,
                            source=source)
    listed = f"{len(gpus)} GPU(s) ({source})" if gpus else f"no GPU listed ({source})"
    line = (f"devices: {listed}, {cores} core(s): "
            + "; ".join(f"{t} {r.describe()}" for t, r in assigned.items()))
    return assigned, line


def _task_argv(config: LaunchConfig, view: Cluster, spec_path: str) -> list:
    """The ps is hosted by tfcluster itself, unless legacy flags make every task run the command."""
    t = view.task
    if t.role is Role.PS and config.legacy_flags is LegacyFlags.NONE:
        return [sys.executable, "-m", "tfcluster", "start", "--cluster", spec_path, "--job", "ps",
                "--task", str(t.index), "--stop-grace", f"{config.stop_grace:g}"] + (
                    ["--verbose"] if config.verbose else [])
    return list(config.command) + view.legacy_flags(style=config.legacy_flags)


def plan_tasks(config: LaunchConfig, log_dir: str, resources=None):
    """``(cluster, [TaskProcess])``: ps tasks first, then trainers, then the evaluator; none started yet.

    ``resources``: ``{task: Resources}`` (:func:`plan_resources`) set in each task's environment.
    """
    cluster, by_port = hold_cluster(config)
    spec_path = os.path.join(log_dir, "cluster.json")
    with open_private(spec_path) as f:
        f.write(cluster.to_json())
    tasks = _cluster_tasks(cluster)
    if config.evaluator:
        tasks.append(Task("evaluator", 0))
    procs = []
    for t in tasks:
        view = cluster.with_task(t.job, t.index)
        hosted = t.role is Role.PS and config.legacy_flags is LegacyFlags.NONE
        env = task_environment(view, config.verbose, reuse_port=t.role is not Role.EVALUATOR,
                               # the hosted ps must import the very tfcluster that runs this launcher
                               import_tfcluster=hosted)
        env[environment.RUN_ID.name] = config.run_id
        env[environment.PS_STATE_RECORD.name] = os.path.abspath(os.path.join(log_dir, PS_STATE_FILE))
        env.update(config.env)
        if resources and t in resources:
            resources[t].apply(env)
        port = placeholder = None
        if t.role is not Role.EVALUATOR:
            port = parse_address(cluster.address(t))[1]
            placeholder = by_port.pop(port)   # the task owns it now, and drops it once it serves
        proc = TaskProcess(t, _task_argv(config, view, spec_path), env,
                           os.path.join(log_dir, f"{t.job}-{t.index}.log"), port, placeholder)
        proc.grace = config.stop_grace     # a task that handles SIGTERM gets to save; others end at once
        procs.append(proc)
    return cluster, procs
