"""The collective runtime ready from the program's first line: data, seeds and models may come before the strategy.

TF's ``MultiWorkerMirroredStrategy`` (what TF2 mode makes of a one-process
strategy on several trainers) configures TF's collective runtime when it is
built, and TF accepts that only before the process's first eager op: a program
that loads its data, draws a seeded tensor or builds a model first (TF's
"Distributed training with Keras" tutorial loads its datasets first) fails with
``RuntimeError: Collective ops must be configured at program startup``. TF2
mode knows TF_CONFIG before the program starts, so at install it configures
what the strategy would (its collective leader, device filter and coordination
service, with TF's values), and hands TF the server to start at the context's
first initialization, with the device configuration the program set by then
(``set_memory_growth``, logical devices, visible devices: TF fixes them there
too). The strategy, built later, finds all of it done and starts nothing twice.

Not on a cluster that has a chief and ps tasks: that is TF 2's
``ParameterServerStrategy``'s shape, whose workers start servers of their own
on their addresses and whose coordinator sets its own coordination service.
There a one-process strategy built after the first tensor is one line naming
the order (exit 2), instead of TF's traceback.
"""

import copy
import logging
from typing import Optional

from ..core.errors import StrategyArgumentError
from ..core.patches import Patch, register
from ..topology.cluster import Cluster, Role
from .strategies import trainers_spec

log = logging.getLogger("tfcluster")

#: The part of the server TF2 mode starts for the strategy: set at install, read at the context's first initialization.
_pending = {}


def task_type(cluster: Cluster) -> str:
    """The task's name in TF's collective runtime (``chief`` for TF_CONFIG's ``master`` too)."""
    return "chief" if cluster.task.role is Role.CHIEF else cluster.task.job


def serves_from_startup(cluster: Optional[Cluster]) -> bool:
    """True for a trainer of a cluster of several whose strategy TF2 mode starts at the program's first op."""
    if trainers_spec(cluster) is None:
        return False
    return not (cluster.num_tasks("ps") and cluster.chief_task is not None)


def configure(cluster: Optional[Cluster]) -> bool:
    """Configure TF's collective runtime for ``cluster``'s trainers before the program's first line; True if done.

    Done as ``CollectiveAllReduceExtended._initialize_multi_worker`` does it, with the same
    values, so the strategy, built later, finds them equal and goes on.
    """
    if not serves_from_startup(cluster):
        return False
    import tensorflow as tf
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context
    spec = tf.train.ClusterSpec(trainers_spec(cluster))
    job, index = task_type(cluster), cluster.task.index
    ctx = context.context()
    if ctx._context_handle is not None:             # something initialized TF already: the strategy's own way
        return False
    leader = multi_worker_util.collective_leader(spec, job, index)
    ctx.configure_collective_ops(collective_leader=leader, scoped_allocator_enabled_ops=("CollectiveReduce",),
                                 device_filters=(f"/job:{job}/task:{index}",))
    if ctx.coordination_service is None:
        ctx.configure_coordination_service(
            service_type="standalone", service_leader=multi_worker_util.coordination_leader(spec),
            coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name=name, num_tasks=spec.num_tasks(name))
                              for name in ("chief", "worker") if name in spec.jobs])
    _pending.update(spec=spec, job=job, index=index, leader=leader)
    return True


def _server_def(config):
    """The ServerDef ``MultiWorkerMirroredStrategy`` would start, from the context's ``config`` of this moment."""
    from tensorflow.core.protobuf import rewriter_config_pb2, tensorflow_server_pb2
    config = copy.deepcopy(config)
    rewrite = config.graph_options.rewrite_options
    rewrite.scoped_allocator_optimization = rewriter_config_pb2.RewriterConfig.ON
    del rewrite.scoped_allocator_opts.enable_op[:]
    rewrite.scoped_allocator_opts.enable_op.append("CollectiveReduce")
    config.experimental.collective_group_leader = _pending["leader"]
    del config.device_filters[:]
    config.device_filters.append(f"/job:{_pending['job']}/task:{_pending['index']}")
    return tensorflow_server_pb2.ServerDef(
        cluster=_pending["spec"].as_cluster_def(), default_session_config=config, job_name=_pending["job"],
        task_index=_pending["index"], protocol="grpc", port=0)


def start_at_first_op(original):
    """``Context.ensure_initialized``: the first initialization also starts the strategy's server (see the module)."""
    def ensure_initialized(self):
        if self._initialized or not _pending or self._collective_ops_server_def is not None \
                or self._server_def is not None:
            return original(self)
        with self._initialize_lock:
            if not self._initialized and self._collective_ops_server_def is None and self._server_def is None:
                self._collective_ops_server_def = _server_def(self.config)
        original(self)
        # TF's coordination service took SIGTERM for its preemption notifier (tfcluster.tf2.preemption)
        from .preemption import stop_at_sigterm
        stop_at_sigterm()
    return ensure_initialized


def _same_task(started, server_def) -> bool:
    """True when ``server_def`` asks for the server already started: the same task of the same trainers."""
    if started is None or (started.job_name, started.task_index) != (server_def.job_name, server_def.task_index):
        return False
    theirs = {job.name: dict(job.tasks) for job in server_def.cluster.job}
    return all(theirs.get(job.name) == dict(job.tasks) for job in started.cluster.job)


def started_once(original):
    """``Context.enable_collective_ops``: the strategy's call finds its server started at the first op and keeps it.

    TF would restart it on the live context (``UpdateServerDef``), warning that tensors made
    before may fail; the server is the one the strategy asks for, so nothing changes.
    """
    def enable_collective_ops(self, server_def):
        if _pending and self._initialized and _same_task(self._collective_ops_server_def, server_def):
            return None
        return original(self, server_def)
    return enable_collective_ops


def refuse_late_order(original, cluster):
    """``Context.configure_collective_ops``: too late to configure is one line naming the order, not a traceback."""
    def configure_collective_ops(self, collective_leader="", *args, **kwargs):
        try:
            return original(self, collective_leader, *args, **kwargs)
        except RuntimeError as e:
            # One process's MultiWorkerMirroredStrategy (no leader) catches it and goes on without the features.
            if not collective_leader or "program startup" not in str(e):
                raise
            where = f"{cluster.task}: " if cluster is not None and cluster.task is not None else ""
            raise StrategyArgumentError(
                f"{where}the all-reduce strategy was built after the program's first tensor, and TF configures "
                f"its collective runtime only before it; on a cluster with a chief and ps tasks (TF 2's "
                f"ParameterServerStrategy's shape) TF2 mode cannot do it first: build the strategy before "
                f"any data or model, or start the cluster without --chief (docs/tf2.md)") from None
    return configure_collective_ops


def this_tasks(device):
    """``device`` with ``/job:localhost`` read as this trainer's own task, where TF2 mode started its server.

    TF's save-and-load guide saves "to the local file system" of a process of a cluster with
    ``experimental_io_device="/job:localhost"``; once the strategy's server runs, the process's
    devices are its task's (``/job:worker/replica:0/task:1``) and TF finds no ``localhost`` job.
    """
    if not device or not _pending:
        return device
    import tensorflow as tf
    spec = tf.DeviceSpec.from_string(device)
    if spec.job != "localhost":
        return device
    return spec.replace(job=_pending["job"], replica=0, task=_pending["index"]).to_string()


def io_device_of_this_task(original):
    """``SaveOptions``/``LoadOptions``/``CheckpointOptions.__init__``: their io device's ``localhost`` is this task."""
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.experimental_io_device:
            self.experimental_io_device = this_tasks(self.experimental_io_device)
    return __init__


_IO_WHY = "experimental_io_device=\"/job:localhost\" names this trainer's own task once the strategy's server runs"
for _name, _target in (("save", "tensorflow.python.saved_model.save_options:SaveOptions"),
                       ("load", "tensorflow.python.saved_model.load_options:LoadOptions"),
                       ("checkpoint", "tensorflow.python.checkpoint.checkpoint_options:CheckpointOptions")):
    register(Patch(f"tf2.io_device_{_name}", _target + ".__init__", _IO_WHY, io_device_of_this_task, "TF2 mode",
                   params=("self",)))

_CONTEXT = "tensorflow.python.eager.context:Context."
register(Patch("tf2.collectives_at_first_op", _CONTEXT + "ensure_initialized",
               "on a cluster of several trainers, the strategy's server starts with the program's first op, so "
               "data, seeds and models may come before the strategy", start_at_first_op, "TF2 mode",
               params=("self",)))
register(Patch("tf2.collectives_once", _CONTEXT + "enable_collective_ops",
               "the strategy finds the server started at the program's first op and keeps it (TF would restart "
               "it on the live context)", started_once, "TF2 mode", params=("self", "server_def")))
register(Patch("tf2.collectives_order", _CONTEXT + "configure_collective_ops",
               "a strategy built too late to configure TF's collective runtime is one line naming the order",
               refuse_late_order, "TF2 mode", params=("self", "collective_leader")))

#: The patches of this module TF2 mode installs (:data:`CLUSTER_PATCHES` given the process's cluster).
PATCHES = ("tf2.collectives_at_first_op", "tf2.collectives_once", "tf2.io_device_save", "tf2.io_device_load",
           "tf2.io_device_checkpoint")
CLUSTER_PATCHES = ("tf2.collectives_order",)
