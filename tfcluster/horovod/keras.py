"""``horovod.tensorflow.keras`` and ``horovod.keras``: Horovod's API for graph-mode tf-keras programs (TF1 mode).

Everything :mod:`.tensorflow` serves, with Horovod's Keras forms: the
optimizer wrapper (:func:`.optimizers.DistributedOptimizer` on a tf-keras
optimizer), collectives that take and return values (run in tf-keras's
session), :func:`load_model` that wraps the saved optimizer again, and
:mod:`.callbacks`.
"""

import tensorflow as tf

from . import callbacks, optimizers
from . import tensorflow as hvd
from .objects import allgather_object, broadcast_object
from .tensorflow import (Adasum, Average, Compression, Sum, cross_rank, cross_size, gloo_built, gloo_enabled,
                         init, is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                         nccl_built, rank, shutdown, size)

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
           "cross_rank", "mpi_threads_supported", "mpi_built", "mpi_enabled", "gloo_built", "gloo_enabled",
           "nccl_built", "Average", "Sum", "Adasum", "Compression", "DistributedOptimizer",
           "broadcast_global_variables", "allreduce", "allgather", "broadcast", "broadcast_object", "allgather_object",
           "load_model", "callbacks"]

DistributedOptimizer = optimizers.DistributedOptimizer


def _run(tensor):
    return tf.compat.v1.keras.backend.get_session().run(tensor)


def broadcast_global_variables(root_rank):
    """Set every global variable to ``root_rank``'s, now, in tf-keras's session."""
    return _run(hvd.broadcast_global_variables(root_rank))


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """``value`` summed over the ranks (their mean with ``average``), as a value."""
    return _run(hvd.allreduce(tf.constant(value, name=name), average=average, op=op, compression=compression,
                              prescale_factor=prescale_factor, postscale_factor=postscale_factor))


def allgather(value, name=None):
    """Every rank's ``value`` concatenated along the first dimension, as a value."""
    return _run(hvd.allgather(tf.constant(value, name=name)))


def broadcast(value, root_rank, name=None):
    """``root_rank``'s ``value``, as a value."""
    return _run(hvd.broadcast(tf.constant(value, name=name), root_rank))


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none):
    """A saved model whose optimizer comes back wrapped in :func:`DistributedOptimizer` (Horovod's rule)."""
    def wrap(cls):
        return lambda **config: DistributedOptimizer(cls(**config), compression=compression)
    known = {}
    for name in dir(tf.compat.v1.keras.optimizers):
        cls = getattr(tf.compat.v1.keras.optimizers, name)
        if isinstance(cls, type) and hasattr(cls, "get_updates") and name != "Optimizer":
            known[name] = known[name.lower()] = wrap(cls)
    known.update({cls.__name__: wrap(cls) for cls in custom_optimizers or ()})
    known.update(custom_objects or {})
    return tf.compat.v1.keras.models.load_model(filepath, custom_objects=known)
