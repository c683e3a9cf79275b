"""Tables on the ps read and updated a row at a time: each touched row crosses the wire once per step.

TensorFlow's ``embedding_lookup`` gathers every id of a batch, duplicates
included, and its gradient carries one row per id. A click-log batch of 512
examples over 26 hashed columns asks the ps for 13,312 rows, of which about a
third are distinct (values follow a Zipf law: a few are in most rows), and
TF 1.x's optimizers add the duplicates up only on the ps (``apply_gradients``
colocates ``_deduplicate_indexed_slices`` with the variable). So the bytes on
the wire grow with the batch, not with the rows it touches.

:func:`install` makes ``embedding_lookup`` (``tf.nn``'s, which tf-keras's
``Embedding`` calls, and ``tf.compat.v1.nn``'s) look up each distinct id
once when the table lives on a ps task:
``tf.unique`` on the worker, TF's own partitioned lookup of the distinct ids
(each part's gather runs on its ps; under a bfloat16 wire its rows travel in
it, graph/wire.py, cast once for a step's pack of them, graph/crossing.py),
then a gather of the rows back to the batch's order on the worker. The gradient follows the same path backwards: the
gather's gradient sums the duplicates on the worker, and each part receives one
row per distinct id it holds. Tables anywhere else (one process, the worker's
own devices) are looked up by TF's code unchanged; so are ragged and sparse ids.
The ids each part is asked for and the rows it sends back cross through
graph/crossing.py, so a step's lookups travel in one transfer per ps each way.
Their gradients hold each id once already, so they are marked so
(:func:`mark_distinct`): TF's optimizers skip their second deduplication on the
ps and update every row of a step at once (graph/sparse_updates.py).
``embedding_lookup_sparse`` and the feature columns' lookups already look up
distinct ids (TF's own ``unique``). A partitioner that asks for more parts than
a table has rows fails in one line (:func:`checked_partitioner_call`). Tables
looked up with ``"mod"`` are noted, so that a checkpoint restores their rows
by id into another part count (graph/repartition.py), and a save reads each
table in place instead of copying it (graph/inplace_reads.py).

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import functools
import sys
import weakref

from ..core import patches
from ..core.errors import SpecError
from . import crossing, inplace_reads, repartition, sparse_updates, wire
from .placement import parts_of, split_by_tfcluster
from .sparse_updates import mark_distinct


def on_ps(params) -> bool:
    """True when any part of ``params`` is placed on a ps task (its reads cross the wire)."""
    import tensorflow as tf
    for p in parts_of(params):
        device = getattr(p, "device", "") or ""
        if tf.DeviceSpec.from_string(device).job == "ps":
            return True
    return False


def distinct_lookup(lookup):
    """``lookup`` (TF's ``embedding_lookup``) reading each distinct id once from tables on a ps."""
    @functools.wraps(lookup)
    def embedding_lookup(params, ids, partition_strategy="mod", name=None, validate_indices=True, max_norm=None):
        import tensorflow as tf
        if split_by_tfcluster(params):
            # The code made one variable: id i must stay row i of it, so checkpoints, warm starts and
            # get_variable_value read the table as the code wrote it ("mod" would deal ids over the parts).
            partition_strategy = "div"
        repartition.record_lookup(params, partition_strategy)     # its rows restore by id into any split
        if not on_ps(params) or isinstance(ids, (tf.SparseTensor, tf.RaggedTensor, tf.compat.v1.SparseTensorValue)):
            return lookup(params, ids, partition_strategy, name, validate_indices, max_norm)
        if partition_strategy not in ("mod", "div"):
            return lookup(params, ids, partition_strategy, name, validate_indices, max_norm)   # TF's own error
        with tf.compat.v1.name_scope(name, "embedding_lookup"):
            ids = tf.convert_to_tensor(ids)
            rows, position, count = _distinct_rows(parts_of(params), ids, partition_strategy, max_norm)
            gathered = _to_batch(rows, position, count)
            if ids.shape.rank == 1:     # a column of ids (a Keras Embedding's, a feature's): rows in its order
                return gathered
            out = tf.reshape(gathered, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
            out.set_shape(ids.shape.concatenate(rows.shape[1:]))
            return out
    embedding_lookup.__wrapped__ = lookup
    return embedding_lookup


class _Split:
    """A batch's distinct ids dealt over a table's parts (TF's "mod" or "div" rule), on the reading device.

    ``distinct``: ``(the distinct ids, each id's position among them, how many)``, shared by every split of the
    same ids. ``ids_on(part_index, device)``: that part's ids (rows of the part) as its ps reads them, one
    crossing per device, shared by every table of the same split looked up with the same ids (a wide and a deep
    table).
    """

    def __init__(self, parts, distinct, strategy):
        import tensorflow as tf
        n = len(parts)
        distinct, self.position, self.count = distinct
        if n == 1:
            self.local, self.order = [distinct], None
        else:
            which, local = _deal(parts, distinct, strategy)
            self.local = tf.dynamic_partition(local, which, n)
            self.order = tf.dynamic_partition(tf.range(self.count), which, n)
        #: How many ids each part is asked for (int32 scalars, on the reading side).
        self.sizes = [self.count] if n == 1 else [tf.size(local) for local in self.local]
        self._on = {}

    def ids_on(self, index: int, device: str):
        """Part ``index``'s ids, read on ``device`` (its ps), marked distinct for the optimizers."""
        key = (index, device)
        if key not in self._on:
            ids = crossing.cross(self.local[index], device)
            mark_distinct(ids)
            self._on[key] = ids
        return self._on[key]


def _deal(parts, ids, strategy):
    """``(part of each id as int32, its row in that part)``: TF's embedding_lookup rule for ``strategy``."""
    import tensorflow as tf
    n = len(parts)
    if strategy == "mod":
        return tf.cast(ids % n, tf.int32), ids // n
    sizes = [p.shape[0] for p in parts]
    if all(s is not None for s in sizes):
        total = tf.constant(sum(int(s) for s in sizes), ids.dtype)
    else:
        total = tf.cast(tf.add_n([tf.shape(p)[0] for p in parts]), ids.dtype)
    per, extras = total // n, total % n
    which = tf.maximum(ids // (per + 1), (ids - extras) // per)
    local = tf.where(which < extras, ids % (per + 1), (ids - extras) % per)
    return tf.cast(which, tf.int32), local


#: The gradient of a part's gather: its rows' gradient as they arrived on its ps, indexed by the ids it read.
_GATHER_GRADIENT = "TfclusterPartGather"


def _part_gather_gradient(op, grad):
    """TF's gather gradient (``ResourceGather``; ``GatherV2`` of a reference variable), made next to the part:
    TF's makes its reshapes wherever ``tf.gradients`` is called (a worker, unless gradients are colocated with
    their ops), so rows that crossed to the ps would cross back and forth again; and its indices are the ids as
    the lookup marked them distinct. Where the part's shape is static and the rows' gradient already has its
    width (a lookup's always has), that gradient is the update as it is: no shape read, no reshape, every step."""
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops
    resource = op.type == "ResourceGather"
    with op.graph.colocate_with(op, ignore_existing=True):
        if isinstance(grad, tf.IndexedSlices):
            grad = tf.convert_to_tensor(grad)
        static = _static_variable_shape(op.inputs[0]) if resource else op.inputs[0].shape
        if static.is_fully_defined() and grad.shape.rank == 2 and grad.shape[1:] == static[1:]:
            return (tf.IndexedSlices(grad, op.inputs[1], tf.constant(static.as_list(), tf.int32)),) + \
                (None,) * (len(op.inputs) - 1)
        shape = resource_variable_ops.variable_shape(op.inputs[0]) if resource else tf.shape(op.inputs[0])
        values = tf.reshape(grad, tf.concat([tf.shape(op.inputs[1])[:1], shape[1:]], 0))
    return (tf.IndexedSlices(values, op.inputs[1], shape),) + (None,) * (len(op.inputs) - 1)


def _static_variable_shape(handle):
    """The shape a resource variable's handle was made with (its ``VarHandleOp``'s), or an unknown shape."""
    import tensorflow as tf
    op = handle.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    if op.type != "VarHandleOp":
        return tf.TensorShape(None)
    return tf.TensorShape(op.get_attr("shape"))


#: The gradient of the gather that puts a batch's distinct rows back in the batch's order.
_TO_BATCH_GRADIENT = "TfclusterToBatch"

#: The distinct-row count of each such gather, by graph: ``{graph: {op name: int32 scalar}}``.
_COUNTS = weakref.WeakKeyDictionary()


def _to_batch(rows, position, count):
    """``rows`` (a batch's distinct rows) gathered into the batch's order; its gradient sums each id's rows into
    one (a segment sum over the ``count`` distinct ids), where TF's makes indexed slices of a row per id, their
    shapes, and a dense conversion (the same sum) wherever they meet the stitch of the parts."""
    import tensorflow as tf
    graph = rows.graph
    _register_gradient(_TO_BATCH_GRADIENT, _to_batch_gradient)
    with graph.gradient_override_map({"GatherV2": _TO_BATCH_GRADIENT}):
        gathered = tf.gather(rows, position)
    _COUNTS.setdefault(graph, {})[gathered.op.name] = count
    return gathered


def _to_batch_gradient(op, grad):
    import tensorflow as tf
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.convert_to_tensor(grad)
    count = _COUNTS[op.graph][op.name]
    return (tf.math.unsorted_segment_sum(grad, op.inputs[1], count),) + (None,) * (len(op.inputs) - 1)


def _register_gradient(name, function):
    import tensorflow as tf
    try:
        tf.RegisterGradient(name)(function)
    except KeyError:  # registered already (one registry per process)
        pass


#: A graph's splits by the ids they deal and how: ``{graph: {key: _Split}}``.
_SPLITS = weakref.WeakKeyDictionary()
#: A graph's distinct ids by the ids they are of: ``{graph: {(ids name, context): (distinct, position, count)}}``.
_UNIQUES = weakref.WeakKeyDictionary()


def _split_of(parts, ids, strategy) -> "_Split":
    """The split of ``ids`` over parts shaped as ``parts`` are, made once per graph and control-flow context; the
    ids are made distinct once for every split of them: a wide and a deep table split over the ps by their bytes
    end their parts at other rows, and the ``Unique`` of a click-through batch's 13,312 ids is a millisecond."""
    import tensorflow as tf
    graph = ids.graph
    context = graph._get_control_flow_context()     # noqa: SLF001 (tensors do not cross into a while loop)
    rows = tuple(tuple(p.shape.as_list()[:1]) for p in parts)
    key = (ids.name, strategy if len(parts) > 1 else "", rows, id(context))
    splits = _SPLITS.setdefault(graph, {})
    if key not in splits:
        uniques = _UNIQUES.setdefault(graph, {})
        if (ids.name, id(context)) not in uniques:
            distinct, position = tf.unique(ids if ids.shape.rank == 1 else tf.reshape(ids, [-1]))
            uniques[ids.name, id(context)] = (distinct, position, tf.size(distinct))
        splits[key] = _Split(parts, uniques[ids.name, id(context)], strategy)
    return splits[key]


def _distinct_rows(parts, ids, strategy, max_norm):
    """``(rows of the batch's distinct ids, each id's position among them, how many)``: each part's rows gathered
    on its ps from ids that crossed once, and crossing back (in 16 bits where its wire is, graph/wire.py)."""
    import tensorflow as tf
    from tensorflow.python.ops import embedding_ops
    tf1 = tf.compat.v1
    _register_gradient(_GATHER_GRADIENT, _part_gather_gradient)
    split = _split_of(parts, ids, strategy)
    narrow = wire.rows_wire(parts)
    graph = ids.graph
    rows = []
    for index, part in enumerate(parts):
        with graph.colocate_with(part), tf1.device(None):
            part_ids = split.ids_on(index, part.device)
            with graph.gradient_override_map({"ResourceGather": _GATHER_GRADIENT, "GatherV2": _GATHER_GRADIENT}):
                part_rows = tf.gather(part, part_ids)
            if max_norm is not None:
                part_rows = embedding_ops._clip(part_rows, part_ids, max_norm)   # noqa: SLF001 (TF's rule)
            width = part_rows.shape[1:]
            # Either side knows how many rows cross (the ids sent, the ids read) and their width: a pack of the
            # rows, or of their gradient on the way back, splits by that with no shape read.
            fixed = width.as_list() if width.is_fully_defined() else None
            there = [tf.size(part_ids)] + fixed if fixed is not None else None
        rows.append(crossing.cross(part_rows, "", shape=[split.sizes[index]] + fixed if fixed is not None else None,
                                   kind="rows", sent_shape=there, wire=narrow or ""))
    if split.order is None:
        return rows[0], split.position, split.count
    stitched = tf.dynamic_stitch(split.order, rows)
    stitched.set_shape(tf.TensorShape([None]).concatenate(rows[0].shape[1:]))
    return stitched, split.position, split.count


def original_lookup():
    """TF's own ``embedding_lookup`` (as it was before :func:`install`)."""
    return patches.original("sparse.distinct_lookup")


def checked_partitioner_call(call):
    """TF's ``_call_partitioner`` refusing, in one line, more parts than the split axis has rows.

    TF's own check comes later, deep in the variable store, as ``Expected 0 <=
    offset < shape but found offset=3, shape=3 for var_offset=[3, 0]``.
    """
    @functools.wraps(call)
    def _call_partitioner(partitioner, shape, dtype):
        slicing = call(partitioner, shape, dtype)
        dims = shape.as_list()
        for axis, parts in enumerate(slicing):
            if parts > dims[axis]:
                raise SpecError(f"a partitioner asked for {parts} parts along axis {axis} of a variable of shape "
                                f"{dims}, whose axis {axis} has only {dims[axis]}: ask for at most {dims[axis]} (TF's "
                                "fixed_size_partitioner and tfcluster's own never ask for more)")
        return slicing
    _call_partitioner.__wrapped__ = call
    return _call_partitioner


patches.register(patches.Patch(
    "sparse.checked_partitioner", "tensorflow.python.ops.variable_scope:_call_partitioner",
    "a partitioner that asks for more parts than the split axis has rows fails in one line, not deep in TF's "
    "variable store", checked_partitioner_call, "fit's ps strategies, the Estimator, TF1 mode",
    params=("partitioner", "shape", "dtype")))
patches.register(patches.Patch(
    "sparse.distinct_lookup", "tensorflow.python.ops.embedding_ops:embedding_lookup",
    "a lookup reads each distinct id once from tables on a ps (16-bit rows where the wire is narrow); a table "
    "tfcluster split reads as the one variable the code made", distinct_lookup,
    "fit's ps strategies, the Estimator, TF1 mode",
    params=("params", "ids", "partition_strategy", "name", "validate_indices", "max_norm"),
    # embedding_lookup_v2 (tf.nn, tf-keras's Embedding) calls the module's name; tf.compat.v1.nn holds its own.
    also=("tensorflow.compat.v1:nn.embedding_lookup",)))


def install():
    """Make ``embedding_lookup`` read each distinct id once from tables on a ps, partitioners that ask for more
    parts than rows fail in one line, "mod" tables restore by id, and saves read tables in place (idempotent,
    per process)."""
    patches.install("sparse.checked_partitioner")
    repartition.install()
    inplace_reads.install()
    patches.install("sparse.distinct_lookup")
    # tf-keras's optimizers where the program uses tf-keras (never imported for it)
    sparse_updates.install(keras="tf_keras" in sys.modules)
    crossing.install()
