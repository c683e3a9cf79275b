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
(each part's gather runs on its ps; under a bfloat16 wire its rows are cast
there, graph/wire.py), then a gather of the rows back to the
batch's order on the worker. The gradient follows the same path backwards: the
gather's gradient sums the duplicates on the worker, and each part receives one
row per distinct id it holds. Tables anywhere else (one process, the worker's
own devices) are looked up by TF's code unchanged; so are ragged and sparse ids.
``embedding_lookup_sparse`` and the feature columns' lookups already look up
distinct ids (TF's own ``unique``). A partitioner that asks for more parts than
a table has rows fails in one line (:func:`checked_partitioner_call`). Tables
looked up with ``"mod"`` are noted, so that a checkpoint restores their rows
by id into another part count (graph/repartition.py), and a save reads each
table in place instead of copying it (graph/inplace_reads.py).

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import functools

from ..core import patches
from ..core.errors import SpecError
from . import inplace_reads, repartition, wire
from .placement import parts_of, split_by_tfcluster


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
        with tf.compat.v1.name_scope(name, "embedding_lookup"):
            ids = tf.convert_to_tensor(ids)
            distinct, position = tf.unique(tf.reshape(ids, [-1]))
            narrow = wire.rows_wire(parts_of(params))
            if narrow:  # each part's rows leave its ps in 16 bits (graph/wire.py)
                from tensorflow.python.ops import embedding_ops
                rows = wire.unpack(embedding_ops._embedding_lookup_and_transform(
                    params, distinct, partition_strategy, max_norm=max_norm,
                    transform_fn=lambda part_rows: wire.pack(part_rows, narrow)[0]), None)
            else:
                rows = lookup(params, distinct, partition_strategy, None, validate_indices, max_norm)
            gathered = tf.gather(rows, position)
            out = tf.reshape(gathered, tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
            out.set_shape(ids.shape.concatenate(rows.shape[1:]))
            return out
    embedding_lookup.__wrapped__ = lookup
    return embedding_lookup


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
