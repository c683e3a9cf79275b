"""A checkpoint reads each variable where it lies, not a copy of it: a table's save costs no second table.

A resource variable updated by sparse ops (a table's ``ResourceSparseApplyAdagrad``,
its gathers) is in copy-on-read mode: a plain read copies the whole tensor,
so that later sparse updates cannot change what the reader holds. The Saver
reads with ``read_value_no_copy``, which first turns that mode off
(``DisableCopyOnRead``) and then reads; but in graph mode TF 2.21 builds the two
ops with nothing ordering them, and the read usually runs first. So each save
copied every sparsely updated variable on its ps at once: measured on one ps
holding a 166 MB table and its 166 MB Adagrad slot, +325 MB during every save
(docs/memory.md). :func:`install` adds the missing control dependency; a save
then costs the ps +8 MB.

A variable that another worker updates while the save is writing it is still
copied once, by the update (TF copies a buffer a reader holds before changing
it): concurrent async training keeps part of that cost, a chief saving between
its own steps none.

TensorFlow is imported lazily, so importing this module stays cheap.
"""

import functools

from ..core import patches


def ordered_read_value_no_copy(read_value_no_copy):
    """TF's ``read_value_no_copy`` with copy-on-read turned off before, not beside, the read (graph mode)."""
    @functools.wraps(read_value_no_copy)
    def read(self):
        import tensorflow as tf
        from tensorflow.python.ops import gen_resource_variable_ops
        if tf.executing_eagerly():
            return read_value_no_copy(self)    # eager ops run in program order already
        with tf.name_scope("Read"):
            off = gen_resource_variable_ops.disable_copy_on_read(self.handle)
            with tf.control_dependencies([off]):
                value = self._read_variable_op(no_copy=True)    # TF's read (its own unordered off is harmless)
        return tf.identity(value)
    read.__wrapped__ = read_value_no_copy
    return read


patches.register(patches.Patch(
    "inplace_reads.ordered_read", "tensorflow.python.ops.resource_variable_ops:BaseResourceVariable.read_value_no_copy",
    "the Saver's no-copy read of a table runs after copy-on-read is off, so a save reads it in place "
    "(docs/memory.md)", ordered_read_value_no_copy, "fit's ps strategies, the Estimator, TF1 mode",
    params=("self",)))


def install():
    """Make the Saver's no-copy reads of resource variables run after copy-on-read is off (idempotent)."""
    patches.install("inplace_reads.ordered_read")
