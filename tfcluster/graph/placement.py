"""Where variables live: a byte-balanced ps device setter, a partitioner, and a placement report.

TensorFlow's ``replica_device_setter`` spreads variables round-robin, counting
variables, not bytes, so one ps can end up with 94 MB and another with 0.7 MB
(pitfalls item 10, tensorflow/tensorflow#24953). :class:`ByteBalancedSetter`
puts each new variable on the ps that holds the fewest bytes so far. An online
greedy is at most one variable away from even; :func:`partition_big_variables`
splits the variables that would spoil that, so no single one dominates a ps.

It also keeps every part small enough to travel fast: TF 2.21's gRPC runtime
moves one tensor at a time per RecvTensor call, and a worker pulls a single
64 MB variable from a ps at about a third of the speed it pulls the same bytes
as eight 8 MB variables (0.9 against 2.5 GB/s here; P7 in scripts/bench.py).
:func:`partitioning_getter` applies a partitioner only where it is safe.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

from ..core import environment
from ..core.errors import SpecError
from ..core.private import open_private
from ..topology.cluster import Task

log = logging.getLogger("tfcluster")

#: Op types that hold state and belong on a ps (as in TF's device_setter).
PS_OPS = ("Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp",
          "MutableHashTable", "MutableHashTableV2", "MutableHashTableOfTensors",
          "MutableHashTableOfTensorsV2", "MutableDenseHashTable", "MutableDenseHashTableV2",
          "BoostedTreesEnsembleResourceHandleOp", "BoostedTreesQuantileStreamResourceHandleOp",
          "ResourceConditionalAccumulator", "DecisionTreeResource")

#: Default for the largest part of a variable on a ps (ParameterServerStrategy).
MAX_SHARD_BYTES = 8 << 20

#: Graph collection of per-worker training state that lives on the ps but is
#: not part of the model (sync gradient slots, stamps); never checkpointed.
SYNC_STATE_COLLECTION = "tfcluster_sync_state"

#: Graph collection of the towers' copies of variables (mirrored towers):
#: local, refreshed after each update, never checkpointed.
REPLICA_COLLECTION = "tfcluster_replicas"


def _op_bytes(op) -> int:
    """Bytes a variable op will hold, from its shape and dtype attrs (0 if unknown)."""
    try:
        shape = op.get_attr("shape")
        dtype = op.get_attr("dtype")
    except ValueError:
        return 0
    import tensorflow as tf
    shape = tf.TensorShape(shape)
    n = shape.num_elements()
    if n is None:
        return 0
    return int(n) * tf.as_dtype(dtype).base_dtype.size


def _task_device(device: str) -> str:
    """``/job:ps/task:1/device:CPU:0`` -> ``/job:ps/task:1``; others unchanged."""
    if not device:
        return "(unplaced)"
    import tensorflow as tf
    spec = tf.DeviceSpec.from_string(device)
    if spec.job is None:
        return spec.to_string() or "(unplaced)"
    out = f"/job:{spec.job}"
    if spec.task is not None:
        out += f"/task:{spec.task}"
    return out


class ByteBalancedSetter:
    """A device function: each new variable goes to the ps with the fewest bytes so far.

    Use it like ``replica_device_setter``: ``with tf.device(setter): build()``.
    Non-variable ops go to ``worker_device``. A device already given with a
    job (``with tf.device("/job:ps/task:1")``) is respected; one without a job
    (``"/CPU:0"``) is merged into the chosen task.
    """

    def __init__(self, ps_devices: Sequence[str], worker_device: Optional[str] = None, ps_ops=PS_OPS):
        if not ps_devices:
            raise SpecError("ByteBalancedSetter needs at least one ps device")
        self.ps_devices = tuple(ps_devices)
        self.worker_device = worker_device
        self.ps_ops = frozenset(ps_ops)
        self.loads = {d: 0 for d in self.ps_devices}
        self.assigned = []  # (op name, ps device, bytes) in creation order

    @classmethod
    def for_cluster(cls, cluster, task=None, ps_ops=PS_OPS) -> "ByteBalancedSetter":
        """The setter for a cluster's ps tasks, with this task (if any) as the worker device."""
        ps = [t.device for t in cluster.tasks(("ps",))]
        t = task or cluster.task
        return cls(ps, t.device if t is not None else None, ps_ops)

    def _choose(self, nbytes: int) -> str:
        # min() keeps the first of equals, so ties go to the lowest ps index.
        device = min(self.ps_devices, key=lambda d: self.loads[d])
        self.loads[device] += nbytes
        return device

    def __call__(self, op) -> str:
        import tensorflow as tf
        current = tf.DeviceSpec.from_string(op.device or "")
        if op.type in self.ps_ops:
            if current.job is not None:
                # An explicit pin: count its bytes where it goes, keep the pin.
                pinned = _task_device(current.to_string())
                if pinned in self.loads:
                    self.loads[pinned] += _op_bytes(op)
                return current.to_string()
            nbytes = _op_bytes(op)
            device = self._choose(nbytes)
            self.assigned.append((op.name, device, nbytes))
            return tf.DeviceSpec.from_string(device).make_merged_spec(current).to_string()
        if self.worker_device is None:
            return current.to_string()
        return tf.DeviceSpec.from_string(self.worker_device).make_merged_spec(current).to_string()


def device_setter(cluster, task=None):
    """A byte-balanced device setter for ``cluster`` (None when it has no ps tasks)."""
    if cluster is None or not cluster.num_tasks("ps"):
        return None
    return ByteBalancedSetter.for_cluster(cluster, task)


def check_max_shard_bytes(max_shard_bytes: Optional[int]):
    """Refuse a largest part of a variable that is not a whole number of bytes >= 1 (None: no limit)."""
    if max_shard_bytes is not None and (isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int)
                                        or max_shard_bytes < 1):
        raise SpecError(f"max_shard_bytes must be a whole number >= 1 (or None), got {max_shard_bytes!r}")


#: With ps on 2 or more machines, a dense variable at least this big is split over all of them: every step
#: moves all of its bytes both ways, so one big kernel on one ps makes that ps's network the busiest
#: (docs/embeddings.md, C7). On one machine the parts' extra transfers cost ~10% and balance nothing.
SPREAD_BYTES = 256 << 10

#: A variable with at least this many rows per number in a row is a table (an embedding, a linear model's
#: weights over hashed values): read and updated a row at a time by lookups, not pulled whole.
TABLE_ROWS_PER_WIDTH = 64


def is_table(shape) -> bool:
    """True for a tall matrix: a table that lookups read by rows (see :data:`TABLE_ROWS_PER_WIDTH`).

    A vector is not one: it is pulled whole (a bias, a flat buffer), however long.
    """
    import tensorflow as tf
    shape = tf.TensorShape(shape)
    if shape.rank is None or shape.rank < 2 or not shape.is_fully_defined():
        return False
    width = shape.num_elements() // max(int(shape[0]), 1)
    return int(shape[0]) >= TABLE_ROWS_PER_WIDTH * max(width, 1)


def partition_big_variables(num_shards: int, min_bytes: int = 1 << 20, axis: int = 0,
                            max_shard_bytes: Optional[int] = None, tables_across: Optional[int] = None):
    """A variable partitioner: variables of ``min_bytes`` or more are split into ``num_shards`` along ``axis``.

    With ``max_shard_bytes``, any variable bigger than that is also split into
    enough shards that none is bigger (see the module docstring for why). Use it with
    ``tf.compat.v1.variable_scope(..., partitioner=...)``; each part is a
    variable of its own, so the byte-balanced setter spreads them. Smaller
    variables stay whole. With ``tables_across``, a table (:func:`is_table`)
    bigger than ``max_shard_bytes`` is split into that many parts (one per ps)
    instead: a lookup moves rows, not parts, and each part costs every step a
    gather, a transfer and an update of its own (docs/embeddings.md).
    """
    if num_shards < 1:
        raise SpecError(f"num_shards must be >= 1, got {num_shards}")
    check_max_shard_bytes(max_shard_bytes)

    def partitioner(shape, dtype):
        import tensorflow as tf
        shape = tf.TensorShape(shape)
        parts = [1] * shape.rank
        n = shape.num_elements()
        if n is None or shape.rank == 0:
            return parts
        nbytes = _nbytes(shape, dtype)
        shards = num_shards if nbytes >= min_bytes else 1
        if max_shard_bytes is not None and nbytes > max_shard_bytes:
            table = tables_across is not None and axis == 0 and is_table(shape)
            shards = max(shards, tables_across if table else -(-nbytes // max_shard_bytes))
        parts[axis] = max(1, min(shards, int(shape[axis])))
        return parts

    return partitioner


def partitioning_getter(partitioner):
    """A variable-scope custom getter that applies ``partitioner`` to the variables it can split.

    A variable is left whole when the code chose its own partitioner, when its
    shape is not given, when its initial value is data (an array, a tensor,
    or ``constant_initializer`` of an array): those cannot be split part by part,
    and when it is another variable's optimizer slot (TF's slot_creator turns a
    scope's partitioner off for slots: a slot has its variable's shape and place).
    A variable the partitioner leaves in one part stays a plain variable. A
    split variable that is not a table starts with the values one process
    would give it (:func:`whole_then_sliced`); a table's parts start part by
    part, as TF 1.x's partitioners do, since a whole table may not fit one task.
    """
    def custom_getter(getter, name, *args, **kwargs):
        shape, dtype = kwargs.get("shape"), kwargs.get("dtype")
        ours = kwargs.get("partitioner") is None and dtype is not None \
            and _splittable(shape, kwargs.get("initializer")) and not _is_slot(name) \
            and max(partitioner(shape, dtype), default=1) > 1
        if ours:
            kwargs["partitioner"] = partitioner
            if not is_table(shape) and _nbytes(shape, dtype) <= SLICED_INIT_MAX_BYTES:
                kwargs["initializer"] = whole_then_sliced(kwargs.get("initializer"))
        variable = getter(name, *args, **kwargs)
        if ours and type(variable).__name__ == "PartitionedVariable":
            for part in variable:
                part._tfcluster_split = True
        return variable

    return custom_getter


@contextlib.contextmanager
def spread_over_ps(cluster, partition_min_bytes: Optional[int] = None,
                   max_shard_bytes: Optional[int] = MAX_SHARD_BYTES):
    """Variables made inside are split over ``cluster``'s ps where it pays: a table over ``max_shard_bytes`` in
    one part per ps, another variable over it in parts no bigger, and (ps on 2+ machines, or
    ``partition_min_bytes``) every variable of ``SPREAD_BYTES`` or more over every ps. A program's own
    partitioner is kept (:func:`partitioning_getter`)."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    num_ps = cluster.num_tasks("ps")
    spread = partition_min_bytes
    if spread is None:  # ps on one machine share its CPUs and loopback: evening their traffic buys nothing
        spread = SPREAD_BYTES if len(cluster.hosts("ps")) > 1 else 0
    if not (spread or max_shard_bytes):
        yield
        return
    p = partition_big_variables(num_ps if spread else 1, spread, max_shard_bytes=max_shard_bytes,
                                tables_across=num_ps)
    with tf1.variable_scope(tf1.get_variable_scope(), custom_getter=partitioning_getter(p),
                            auxiliary_name_scope=False):
        yield


def parts_of(params) -> list:
    """The variables (or tensors) of ``params``: a PartitionedVariable, a list of parts, or one."""
    if isinstance(params, (list, tuple)) or type(params).__name__ == "PartitionedVariable":
        return list(params)
    return [params]


def split_by_tfcluster(params) -> bool:
    """True when ``params`` (a PartitionedVariable or its parts) was split by :func:`partitioning_getter`, not by
    the code's own partitioner: the code saw one variable, so it is looked up as one (``"div"``: id i is row i)."""
    parts = parts_of(params)
    return len(parts) > 1 and all(getattr(p, "_tfcluster_split", False) for p in parts)


#: Each part of a split dense variable draws the whole initial value and keeps its slice: past this size
#: that transient costs more than starting exactly where one process would is worth.
SLICED_INIT_MAX_BYTES = 64 << 20


def _nbytes(shape, dtype) -> int:
    """Bytes of a fully defined ``shape`` of ``dtype``."""
    import tensorflow as tf
    return tf.TensorShape(shape).num_elements() * tf.as_dtype(dtype).base_dtype.size


def whole_then_sliced(initializer):
    """An initializer giving each part of a split variable its slice of the whole variable's initial value.

    TF initialises a partitioned variable part by part with the same seed, so its parts start alike and unlike
    the same variable in one process; a random initializer's whole value, sliced, is the one-process value.
    ``initializer`` None stays None: get_variable's default draws each part with an op seed of its own.
    """
    import tensorflow as tf
    if initializer is None:
        return None
    if isinstance(initializer, type):
        initializer = initializer()

    def sliced(shape, dtype=None, partition_info=None):
        if partition_info is None:
            return initializer(shape, dtype=dtype)
        whole = initializer(partition_info.full_shape, dtype=dtype)
        return tf.slice(whole, partition_info.var_offset, shape)
    return sliced


def _is_slot(name: str) -> bool:
    """True when ``name`` is directly under a variable's name: a slot (``table/part_0/Adagrad/``)."""
    import tensorflow as tf
    parent = name.rstrip("/").rpartition("/")[0]
    if not parent:
        return False
    try:
        return tf.compat.v1.get_default_graph().get_operation_by_name(parent).type in PS_OPS
    except KeyError:
        return False


def _splittable(shape, initializer) -> bool:
    import numpy as np
    import tensorflow as tf
    if shape is None or not tf.TensorShape(shape).is_fully_defined():
        return False
    if initializer is None:
        return True
    if not callable(initializer) or isinstance(initializer, (tf.Tensor, np.ndarray)):
        return False
    value = getattr(initializer, "value", None)  # tf.compat.v1.constant_initializer
    return value is None or np.size(value) <= 1


# ----------------------------------------------------------------- the report
@dataclass(frozen=True)
class VariablePlacement:
    """One variable of a placement report: its name, task device, shape, dtype and bytes."""

    name: str
    device: str
    shape: tuple
    dtype: str
    nbytes: int


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


class PlacementReport:
    """Which variable lives on which device, with bytes: as data, and printable."""

    def __init__(self, records, devices: Sequence[str] = ()):
        self.records = tuple(records)
        # Devices that should appear even when empty (an idle ps is news).
        self.devices = tuple(dict.fromkeys(list(devices) + [r.device for r in self.records]))

    def totals(self) -> dict:
        """Bytes per device, ``{"/job:ps/task:0": 123, ...}``, listed devices first."""
        out = {d: 0 for d in self.devices}
        for r in self.records:
            out[r.device] = out.get(r.device, 0) + r.nbytes
        return out

    def counts(self) -> dict:
        """Number of variables per device."""
        out = {d: 0 for d in self.devices}
        for r in self.records:
            out[r.device] = out.get(r.device, 0) + 1
        return out

    def on(self, device: str) -> list:
        """The records of one device."""
        return [r for r in self.records if r.device == device]

    def imbalance(self, job: Optional[str] = "ps") -> float:
        """How far the fullest device is above the mean, as a fraction (0.0 = even).

        Only devices of ``job`` count (all devices when ``job`` is None).
        """
        totals = {d: b for d, b in self.totals().items() if job is None or d.startswith(f"/job:{job}/")}
        if not totals:
            return 0.0
        mean = sum(totals.values()) / len(totals)
        return 0.0 if mean == 0 else max(totals.values()) / mean - 1.0

    def format(self, per_variable: bool = True) -> str:
        """Readable text: per device, its total and (optionally) each variable."""
        totals, counts = self.totals(), self.counts()
        grand = sum(totals.values()) or 1
        lines = [f"placement of {len(self.records)} variable(s), {human_bytes(sum(totals.values()))}:"]
        for d in totals:
            lines.append(f"  {d:<26} {human_bytes(totals[d]):>10}  {100.0 * totals[d] / grand:5.1f}%  "
                         f"{counts[d]} variable(s)")
            if per_variable:
                for r in sorted(self.on(d), key=lambda r: -r.nbytes):
                    shape = "x".join(str(s) for s in r.shape) or "scalar"
                    lines.append(f"      {r.name:<40} {shape:>14} {r.dtype:<8} {human_bytes(r.nbytes):>10}")
        return "\n".join(lines)

    def print(self, file=None, per_variable: bool = True):
        """Print :meth:`format` to ``file`` (stdout by default)."""
        print(self.format(per_variable), file=file or sys.stdout)

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:
        return f"PlacementReport({len(self.records)} variables on {len(self.devices)} devices)"


def placement_report(graph=None, variables=None, devices: Sequence[str] = ()) -> PlacementReport:
    """Report where the variables of ``graph`` (default graph) were placed.

    By default it covers the model's global variables plus tfcluster's own
    per-worker sync state, which also occupies ps memory, and the towers'
    copies of the variables.
    """
    import tensorflow as tf
    tf1 = tf.compat.v1
    g = graph or tf1.get_default_graph()
    if variables is None:
        variables = list(g.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES))
        for key in (SYNC_STATE_COLLECTION, REPLICA_COLLECTION):
            # By identity: `in` would call Variable.__eq__, elementwise (and failing) when eager is on.
            seen = {id(v) for v in variables}
            variables += [v for v in g.get_collection(key) if id(v) not in seen]
    records = []
    for v in variables:
        shape = tuple(int(s) if s is not None else -1 for s in v.shape.as_list()) if v.shape.rank is not None else ()
        n = v.shape.num_elements()
        dtype = v.dtype.base_dtype
        records.append(VariablePlacement(v.op.name, _task_device(v.device), shape, dtype.name,
                                         int(n) * dtype.size if n is not None else 0))
    return PlacementReport(records, devices)


# ----------------------------------------------------------------- for the launcher
def record_ps_state(totals: dict):
    """Write the bytes placed on each ps task (``{"ps:0": n}``) where the launcher asked (``PS_STATE_RECORD``).

    A file rather than a log line the launcher would parse: the launcher reads it
    when a ps is killed for memory, to say how much state that ps held.
    """
    tasks = {d: Task.of_device(d) for d in totals}
    _write_record({str(tasks[d]): n for d, n in totals.items() if tasks[d] is not None and tasks[d].job == "ps"})


def record_ps_rows(rows: dict, global_step: int):
    """Add to the record the embedding-variable rows each ps holds (``{"ps:0": n}``) at ``global_step``, for the
    launcher's line about a ps killed for memory (a table of ids grows as training runs)."""
    path = environment.PS_STATE_RECORD.get()
    if not path:
        return
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    state[ROWS] = {"rows": {ps: int(n) for ps, n in rows.items()}, "global_step": int(global_step)}
    _write_record(state)


#: The record's key for :func:`record_ps_rows`'s count (every other key is a ps's bytes).
ROWS = "embedding_variable_rows"


def _write_record(state: dict):
    path = environment.PS_STATE_RECORD.get()
    if not path:
        return
    try:
        with open_private(path + ".tmp") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)     # whole or not at all, for a launcher that reads it any time
    except OSError as e:    # a note for the launcher: training goes on without it
        log.debug("cannot write %s: %s", path, e.strerror)
