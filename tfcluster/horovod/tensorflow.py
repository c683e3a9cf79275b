"""``horovod.tensorflow`` for TF 1.x graph programs, on TF's collectives between tfcluster's tasks.

Horovod's last release does not build on TF >= 2.16 (horovod/horovod#4290).
TF1 mode serves its graph API under its own name (``import horovod.tensorflow
as hvd``), mapped onto what tfcluster already runs:

- ranks are TF_CONFIG's trainers, the chief (else worker 0) rank 0; ``local_rank``
  counts the trainers on this host;
- :func:`init` starts this task's TF server with the collective group leader
  set, and the sessions the program opens without a target (Horovod's
  programs open local ones) run on it (:func:`tfcluster.runtime.server.serve_local_sessions`);
- :func:`allreduce` and :class:`DistributedOptimizer` sum with TF's
  ``CollectiveReduceV2`` (divided by the size for ``Average``), :func:`broadcast`
  and :class:`BroadcastGlobalVariablesHook` send with ``CollectiveBcastSendV2``.

Horovod matches the ranks' ops by name; TF's collectives match by instance key,
so each key is derived from the op's name (not from the order ops were made), and
a rank that builds an op the others do not (rank 0's summaries) does not shift
the rest. docs/horovod.md lists what is served and what is refused.
"""

import os
import socket
import zlib

from ..core.errors import HorovodNotInitialized, SpecError
from ..runtime.server import serve_local_sessions, task_server
from ..topology.cluster import Cluster

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
           "cross_rank", "mpi_threads_supported", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled",
           "nccl_built", "Average", "Sum", "Adasum", "allreduce", "grouped_allreduce", "allgather", "alltoall",
           "reducescatter", "join", "broadcast",
           "broadcast_variables", "broadcast_global_variables", "Compression", "BroadcastGlobalVariablesHook"]

#: TF's collective group of Horovod's ranks (tfcluster's collective strategy uses group 1).
GROUP_KEY = 7
#: Seconds a broadcast waits for the other ranks (the first waits for them to start), and any one run of a
#: session hvd.init() serves may last: a rank that stops answering without dying is found then.
COLLECTIVE_TIMEOUT_SECS = 300.0


class _Ops:
    """Horovod's reduction ops, as constants (``hvd.Average``, ``hvd.Sum``, ``hvd.Adasum``)."""
    Average, Sum, Adasum = 0, 1, 2


Average, Sum, Adasum = _Ops.Average, _Ops.Sum, _Ops.Adasum
#: Why hvd.Adasum is refused, in one line.
ADASUM_REFUSED = ("hvd.Adasum is not covered: Horovod defines its numerics in its own C++ ops; use hvd.Average or "
                  "hvd.Sum (docs/horovod.md)")
_state = {}


def init(comm=None, process_sets=None):
    """Join this process's task to the ranks of TF_CONFIG's trainers (once)."""
    if _state:
        return
    if comm is not None or process_sets is not None:
        raise SpecError("hvd.init(comm=..., process_sets=...) is not covered: tfcluster's ranks are TF_CONFIG's "
                        "trainers (docs/horovod.md)")
    cluster = Cluster.from_environment()
    # One process, one trainer, or a task that does not train (an evaluator): a rank of one.
    if cluster is None or cluster.task is None or not cluster.task.trains or cluster.num_replicas < 2:
        _state.update(cluster=None, rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)
        return
    import tensorflow as tf
    trainers = cluster.trainers()
    me = cluster.task
    leader = f"/job:{trainers[0].job}/replica:0/task:{trainers[0].index}"
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True, device_filters=[me.device])
    config.experimental.collective_group_leader = leader
    # The runs' own bound, not the ops': TF starts a thread per collective op that has a timeout, sleeping the
    # whole timeout (tensorflow/tensorflow#62466), and ran a fast program out of threads in seconds.
    config.operation_timeout_in_ms = int(COLLECTIVE_TIMEOUT_SECS * 1000)
    server = task_server(cluster, config=config)
    serve_local_sessions(server, config)
    host = _host(cluster.address(me))
    here = [t for t in trainers if _host(cluster.address(t)) == host]
    hosts = list(dict.fromkeys(_host(cluster.address(t)) for t in trainers))     # in rank order
    _state.update(cluster=cluster, rank=trainers.index(me), size=len(trainers), local_rank=here.index(me),
                  local_size=len(here), cross_rank=hosts.index(host), cross_size=len(hosts),
                  device=f"/job:{me.job}/replica:0/task:{me.index}/device:CPU:0")
    # The cluster is Horovod's from here: the program's Estimator and tf.keras train one rank's copy, as under
    # horovodrun (which sets no TF_CONFIG), instead of joining TF_CONFIG's cluster as between-graph workers.
    os.environ.pop("TF_CONFIG", None)


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return "localhost" if host in ("127.0.0.1", "localhost", socket.gethostname()) else host


def _get(name, key=None):
    """``key`` (default: ``name``) of this rank once :func:`init` ran; the call ``hvd.name()`` before it is one line."""
    if not _state:
        raise HorovodNotInitialized(f"hvd.{name}() before hvd.init(): call hvd.init() first (as Horovod requires)")
    return _state[key or name]


def shutdown():
    """Nothing to release: the task's server lives as long as the process (TF cannot stop one)."""


def is_initialized() -> bool:
    """True once :func:`init` ran."""
    return bool(_state)


def size() -> int:
    """How many ranks: TF_CONFIG's trainers (1 without a cluster)."""
    return _get("size")


def rank() -> int:
    """This process's rank: its index among the trainers, the chief (else worker 0) first."""
    return _get("rank")


def local_size() -> int:
    """How many ranks run on this host."""
    return _get("local_size")


def local_rank() -> int:
    """This process's index among the ranks on its host."""
    return _get("local_rank")


def cross_size() -> int:
    """How many hosts the ranks run on."""
    return _get("cross_size")


def cross_rank() -> int:
    """This host's index among the hosts, in rank order."""
    return _get("cross_rank")


def mpi_threads_supported() -> bool:
    """False: no MPI here (tfcluster's ranks talk over TF's gRPC collectives)."""
    return False


def mpi_built() -> bool:
    """False: tfcluster's Horovod has no MPI."""
    return False


def mpi_enabled() -> bool:
    """False: tfcluster's Horovod has no MPI."""
    return False


def gloo_built() -> bool:
    """False: tfcluster's Horovod has no Gloo."""
    return False


def gloo_enabled() -> bool:
    """False: tfcluster's Horovod has no Gloo."""
    return False


def nccl_built() -> bool:
    """False: the all-reduce is TF's collective (TF picks NCCL itself on GPUs when it can)."""
    return False


def _key(name: str) -> int:
    """The collective instance key of the op ``name`` (the same on every rank that names it the same)."""
    return 1000 + zlib.crc32(name.encode()) % 2_000_000_000


def _collective(tensor, kind: str, name: str, root_rank: int = 0):
    import tensorflow as tf
    state, n = _state, _get(kind, "size")
    scope = tf.compat.v1.get_default_graph().unique_name(name, mark_as_used=False)
    # A broadcast runs once (at the start, where its bound names the ranks that never came); ops of every step
    # have no timeout of their own (see init): a rank that dies fails them at once, one that hangs ends the run.
    timeout = COLLECTIVE_TIMEOUT_SECS if kind == "broadcast" else 0.0
    args = dict(group_size=tf.constant(n), group_key=tf.constant(GROUP_KEY), instance_key=tf.constant(_key(scope)),
                communication_hint="auto", timeout_seconds=timeout)
    with tf.compat.v1.name_scope(name), tf.device(state["device"]):
        if kind == "allreduce":
            return tf.raw_ops.CollectiveReduceV2(input=tensor, ordering_token=[], merge_op="Add", final_op="Id",
                                                 **args)
        if kind == "allgather":
            return tf.raw_ops.CollectiveGatherV2(input=tensor, ordering_token=[], **args)
        if state["rank"] == root_rank:
            return tf.raw_ops.CollectiveBcastSendV2(input=tensor, **args)
        return tf.raw_ops.CollectiveBcastRecvV2(shape=tf.shape(tensor), T=tensor.dtype, **args)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None):
    """The sum over every rank of ``tensor`` (divided by the size for ``op=Average``, Horovod's default).

    ``compression`` packs what is sent (``Compression.fp16``: half the bytes);
    ``prescale_factor`` multiplies each rank's tensor before the sum and
    ``postscale_factor`` the sum, as Horovod's.
    """
    import tensorflow as tf
    op = (Average if average in (None, True) else Sum) if op is None else op
    if op == Adasum:
        raise SpecError(ADASUM_REFUSED)
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tf.convert_to_tensor(tensor)         # dense, as Horovod's sparse_as_dense
    tensor = tf.convert_to_tensor(tensor)
    n = _get("allreduce", "size")
    name = name or f"HorovodAllreduce_{tensor.op.name.replace('/', '_')}"
    if prescale_factor != 1.0:
        tensor = tensor * tf.cast(prescale_factor, tensor.dtype)
    packed, ctx = (compression or Compression.none).compress(tensor)
    summed = (compression or Compression.none).decompress(
        _collective(packed, "allreduce", name) if n > 1 else tf.identity(packed), ctx)
    scale = postscale_factor / n if op == Average else postscale_factor
    return summed * tf.cast(scale, summed.dtype) if scale != 1.0 else summed


def allgather(tensor, name=None):
    """Every rank's ``tensor`` concatenated along the first dimension, rank 0's first (their lengths may differ)."""
    import tensorflow as tf
    tensor = tf.convert_to_tensor(tensor)
    n = _get("allgather", "size")
    if n == 1:
        return tf.identity(tensor)
    name = name or f"HorovodAllgather_{tensor.op.name.replace('/', '_')}"
    rows = _collective(tf.shape(tensor)[:1], "allgather", f"{name}_rows")       # each rank's length
    # TF's gather takes equal shapes: each rank sends its rows padded to the longest, and the padding is cut.
    longest = tf.reduce_max(rows)
    padded = tf.pad(tensor, [[0, longest - tf.shape(tensor)[0]]] + [[0, 0]] * (tensor.shape.ndims - 1))
    gathered = _collective(padded, "allgather", name)
    return tf.concat([gathered[i * longest:i * longest + rows[i]] for i in range(n)], 0)


def alltoall(tensor, splits=None, name=None):
    """Rank r's ``splits[j]`` rows (an equal share without ``splits``) sent to rank j; each rank gets its rows from
    every rank, concatenated in rank order (and the row counts received, when ``splits`` was given)."""
    import tensorflow as tf
    tensor = tf.convert_to_tensor(tensor)
    n, me = _get("alltoall", "size"), _get("alltoall", "rank")
    rows = tf.shape(tensor)[0]
    sent = tf.cast(tf.convert_to_tensor(splits), tf.int32) if splits is not None else tf.fill([n], rows // n)
    if n == 1:
        return (tf.identity(tensor), sent) if splits is not None else tf.identity(tensor)
    name = name or f"HorovodAlltoall_{tensor.op.name.replace('/', '_')}"
    # Every rank's splits, then every rank's rows: TF has no all-to-all between CPU tasks, so each rank takes
    # its part of an all-gather (n times the bytes of Horovod's; its programs send ids and small tables).
    table = tf.reshape(allgather(tf.reshape(sent, [1, n]), name=f"{name}_splits"), [n, n])
    gathered = allgather(tensor, name=name)
    starts = tf.cumsum(tf.reduce_sum(table, 1), exclusive=True) + tf.cumsum(table, 1, exclusive=True)[:, me]
    out = tf.concat([gathered[starts[i]:starts[i] + table[i, me]] for i in range(n)], 0)
    return (out, table[:, me]) if splits is not None else out


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, name=None):
    """:func:`allreduce` of each tensor of ``tensors``, as a list."""
    return [allreduce(t, average, compression=compression, op=op, prescale_factor=prescale_factor,
                      postscale_factor=postscale_factor, name=f"{name}_{i}" if name else None)
            for i, t in enumerate(tensors)]


def reducescatter(tensor, device_dense="", compression=None, op=None, name=None):
    """This rank's share of the first dimension of the ranks' sum (mean for ``op=Average``, the default).

    The rows are split as Horovod splits them, the first ranks one more when
    they do not divide; it is an all-reduce each rank slices (n times Horovod's bytes).
    """
    import tensorflow as tf
    tensor = tf.convert_to_tensor(tensor)
    n, me = _get("reducescatter", "size"), _get("reducescatter", "rank")
    total = allreduce(tensor, compression=compression, op=Average if op is None else op,
                      name=name or f"HorovodReducescatter_{tensor.op.name.replace('/', '_')}")
    rows = tf.shape(total)[0]
    share = rows // n + tf.cast(me < rows % n, tf.int32)
    start = me * (rows // n) + tf.minimum(me, rows % n)
    return total[start:start + share]


def join():
    """One line: Horovod's join lets ranks with fewer batches stop early; tfcluster's ranks step together."""
    raise SpecError("hvd.join() is not covered: give every rank the same number of steps (docs/horovod.md)")


def broadcast(tensor, root_rank, name=None):
    """``root_rank``'s ``tensor`` on every rank."""
    import tensorflow as tf
    tensor = tf.convert_to_tensor(tensor)
    if _get("broadcast", "size") == 1:
        return tf.identity(tensor)
    return _collective(tensor, "broadcast", name or f"HorovodBroadcast_{tensor.op.name.replace('/', '_')}",
                       root_rank)


def broadcast_variables(variables, root_rank):
    """One op that sets every variable of ``variables`` to ``root_rank``'s value."""
    import tensorflow as tf
    return tf.group(*[v.assign(broadcast(v.read_value() if hasattr(v, "read_value") else v, root_rank,
                                         name=f"HorovodBroadcast_{v.op.name.replace('/', '_')}"))
                      for v in variables])


def broadcast_global_variables(root_rank):
    """``broadcast_variables`` of every global variable (TF 1.x graphs)."""
    import tensorflow as tf
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class Compression:
    """Horovod's gradient compression: ``none``, or ``fp16`` (float32 gradients sent as float16)."""

    class none:                 # noqa: N801 (Horovod's name)
        """No compression."""

        @staticmethod
        def compress(tensor):
            """``(tensor, None)``."""
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            """``tensor``."""
            return tensor

    class fp16:                 # noqa: N801 (Horovod's name)
        """float32 and float64 tensors sent as float16, half the bytes; cast back after the sum."""

        @staticmethod
        def compress(tensor):
            """``(tensor as float16, its dtype)`` for a floating tensor, else as it is."""
            import tensorflow as tf
            if tensor.dtype.is_floating and tensor.dtype != tf.float16:
                return tf.cast(tensor, tf.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            """``tensor`` back in its own dtype."""
            import tensorflow as tf
            return tensor if ctx is None else tf.cast(tensor, ctx)


_HOOK = []


def hook_class():
    """Horovod's ``BroadcastGlobalVariablesHook`` class, a ``SessionRunHook`` (made once, when TF is imported)."""
    if not _HOOK:
        import tensorflow as tf

        class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
            """Every global variable set to ``root_rank``'s at each session start (after a restore too)."""

            def __init__(self, root_rank, device=""):
                super().__init__()
                self.root_rank, self.device, self.bcast_op = root_rank, device, None

            def begin(self):
                """Build the broadcast in the graph being run (once per graph)."""
                if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
                    self.bcast_op = broadcast_global_variables(self.root_rank)

            def after_create_session(self, session, coord):
                """Take the root's values, in every session (a restore or a recovery too)."""
                session.run(self.bcast_op)
        _HOOK.append(BroadcastGlobalVariablesHook)
    return _HOOK[0]


def BroadcastGlobalVariablesHook(root_rank, device=""):  # noqa: N802 (Horovod's name; the class is hook_class())
    """Horovod's hook: every global variable set to ``root_rank``'s at each session start (after a restore too)."""
    return hook_class()(root_rank, device)
