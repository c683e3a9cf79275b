"""Horovod's ``DistributedOptimizer``: a ``tf.train`` or tf-keras optimizer whose gradients are all-reduced first.

Both kinds share one rule (:func:`reduce_gradients`): the gradients are
packed by ``compression``, concatenated by dtype, divided by
``gradient_predivide_factor``, summed over the ranks by one
:func:`.tensorflow.allreduce` per dtype (ranks match collectives by name),
and scaled to the mean for ``op=Average``. With ``backward_passes_per_step=k`` (:class:`Aggregation`)
each rank sums its gradients over k passes and the sum is all-reduced and
applied on the k-th; the global step (and a Keras optimizer's ``iterations``)
still counts every pass, as Horovod's ``LocalGradientAggregationHelper`` does.
"""

import tensorflow as tf

from ..core.errors import SpecError
from . import tensorflow as hvd

__all__ = ["DistributedOptimizer", "keras_optimizer", "reduce_gradients", "Aggregation"]


def _check(op, backward_passes_per_step, gradient_predivide_factor):
    if op == hvd.Adasum:
        raise SpecError(hvd.ADASUM_REFUSED)
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise SpecError(f"hvd.DistributedOptimizer(backward_passes_per_step={backward_passes_per_step!r}): give a "
                        "whole number of passes, 1 or more")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise SpecError("hvd.DistributedOptimizer(gradient_predivide_factor=...) needs op=hvd.Average (as Horovod's)")


def reduce_gradients(grads, prefix, op=hvd.Average, compression=hvd.Compression.none, gradient_predivide_factor=1.0):
    """``grads`` (None where a variable has none) all-reduced over the ranks: one collective per dtype.

    Horovod fuses a step's gradients into few buffers (its Tensor Fusion);
    here each dtype's (packed) gradients are concatenated into one all-reduce,
    which TF sums element by element as it would each apart (the same numbers).
    An ``IndexedSlices`` is all-reduced dense, ``sparse_as_dense`` or not.
    """
    packed, by_dtype = {}, {}
    for i, g in enumerate(grads):
        if g is not None:
            packed[i] = compression.compress(tf.convert_to_tensor(g))
            by_dtype.setdefault(packed[i][0].dtype, []).append(i)
    out = list(grads)
    for dtype, idx in sorted(by_dtype.items(), key=lambda item: item[0].name):
        flat = tf.concat([tf.reshape(packed[i][0], [-1]) for i in idx], 0)
        # Horovod's predivide: 1/f before the sum, f/size after (the mean, summed in smaller numbers).
        total = hvd.allreduce(flat, op=op, prescale_factor=1.0 / gradient_predivide_factor,
                              postscale_factor=gradient_predivide_factor, name=f"{prefix}_Allreduce_{dtype.name}")
        parts = tf.split(total, tf.stack([tf.size(packed[i][0]) for i in idx]))
        for i, part in zip(idx, parts):
            out[i] = compression.decompress(tf.reshape(part, tf.shape(packed[i][0])), packed[i][1])
    return out


class Aggregation:
    """Gradients summed locally over ``passes`` backward passes; all-reduced and applied on the last of them."""

    def __init__(self, passes: int, name: str, track=None):
        self.passes, self.name, self.track, self.counter, self.last = passes, name, track, None, None

    def gradients(self, grads, reduce):
        """This pass's gradients added to the sums; on the k-th pass ``reduce(sums)``, else the sums."""
        present = [i for i, g in enumerate(grads) if g is not None]
        with tf.compat.v1.variable_scope(f"{self.name}_aggregation", reuse=tf.compat.v1.AUTO_REUSE):
            self.counter = tf.compat.v1.get_variable("passes", shape=(), dtype=tf.int32, trainable=False,
                                                     initializer=tf.compat.v1.zeros_initializer(),
                                                     collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
            sums = [tf.compat.v1.get_variable(f"sum_{i}", shape=grads[i].shape, dtype=grads[i].dtype, trainable=False,
                                              initializer=tf.compat.v1.zeros_initializer(),
                                              collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
                    for i in present]
        for v in ([self.counter] + sums) if self.track else ():
            self.track(v)           # tf-keras initialises the variables it tracks, not the local collection
        dense = [tf.convert_to_tensor(grads[i]) for i in present]
        fresh = tf.equal(self.counter, 0)       # the first pass of k starts the sums again
        added = [s.assign(tf.where(fresh, g, s + g)) for s, g in zip(sums, dense)]
        with tf.control_dependencies(added):
            count = self.counter.assign_add(1)
        last = self.last = tf.equal(count, self.passes)

        def reduced():
            with tf.control_dependencies([self.counter.assign(0)]):
                return [tf.identity(g) for g in reduce([s.read_value() for s in sums])]
        with tf.control_dependencies(added):
            values = tf.cond(last, reduced, lambda: [tf.identity(s) for s in added])
        values = values if isinstance(values, (list, tuple)) else [values]
        out = [None] * len(grads)
        for i, value in zip(present, values):
            out[i] = value
        return out

    def apply(self, apply, skip):
        """``apply()`` on the pass that all-reduced (the k-th), ``skip()`` on the others."""
        return tf.cond(self.last, lambda: _op(apply()), lambda: _op(skip()))


def _op(result):
    with tf.control_dependencies([result] if result is not None else []):
        return tf.constant(True)


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",  # noqa: N802
                         compression=hvd.Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=hvd.Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=None, scale_local_gradients=True):
    """Horovod's ``DistributedOptimizer``: ``optimizer`` whose gradients are all-reduced over the ranks first.

    A ``tf.compat.v1.train`` optimizer gets a ``tf.train.Optimizer`` that wraps
    it; a tf-keras optimizer a subclass of its own class (:func:`keras_optimizer`).
    """
    _check(op, backward_passes_per_step, gradient_predivide_factor)
    if process_set is not None:
        raise SpecError("hvd.DistributedOptimizer(process_set=...) is not covered: tfcluster's ranks are one set, "
                        "TF_CONFIG's trainers (docs/horovod.md)")
    # num_groups and groups set how Horovod fuses; here a step's gradients are one all-reduce per dtype anyway.
    # sparse_as_dense is taken and has nothing to change: every gradient is all-reduced dense here.
    settings = dict(op=op, compression=compression, gradient_predivide_factor=gradient_predivide_factor)
    if hasattr(optimizer, "get_gradients") and hasattr(optimizer, "get_config"):
        return keras_optimizer(optimizer, name, backward_passes_per_step, average_aggregated_gradients, settings)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise SpecError(f"hvd.DistributedOptimizer takes a tf.compat.v1.train or tf-keras optimizer, not "
                        f"{type(optimizer).__name__} (docs/horovod.md)")
    wrapped = _TrainOptimizer(use_locking, name or f"Distributed{type(optimizer).__name__}")
    wrapped._optimizer, wrapped._settings = optimizer, settings
    wrapped._aggregation = Aggregation(backward_passes_per_step, wrapped._name) if backward_passes_per_step > 1 \
        else None
    wrapped._divisor = backward_passes_per_step if average_aggregated_gradients else 1
    return wrapped


class _TrainOptimizer(tf.compat.v1.train.Optimizer):
    """A ``tf.train`` optimizer whose ``compute_gradients`` are all-reduced over the ranks."""

    def _reduce(self, grads):
        grads = reduce_gradients(grads, self._name, **self._settings)
        return [g / self._divisor if g is not None and self._divisor != 1 else g for g in grads]

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's gradients, all-reduced over every rank (averaged for ``op=Average``)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._aggregation is None:
            return list(zip(self._reduce(grads), variables))
        return list(zip(self._aggregation.gradients(grads, self._reduce), variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's; with ``backward_passes_per_step=k``, on every k-th pass (the step counts each)."""
        if self._aggregation is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)
        # Slots first, outside the condition: TF makes them in apply_gradients' init_scope, but not in a cond.
        self._optimizer._create_slots([v for g, v in grads_and_vars if g is not None])
        skip = (lambda: global_step.assign_add(1)) if global_step is not None else tf.no_op
        return self._aggregation.apply(
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name), skip).op

    def get_slot(self, *args, **kwargs):
        """The wrapped optimizer's."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """The wrapped optimizer's."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's."""
        return self._optimizer.variables(*args, **kwargs)


def keras_optimizer(optimizer, name, passes, average_aggregated_gradients, settings):
    """A tf-keras optimizer of ``optimizer``'s own class and config whose ``get_gradients`` are all-reduced.

    The class keeps its name (Horovod's rule), so a model saved with it loads
    without Horovod; ``get_updates`` applies every ``passes``-th pass.
    """
    base = type(optimizer)
    if not hasattr(base, "get_updates"):
        raise SpecError(f"hvd.DistributedOptimizer({base.__name__}): graph-mode tf-keras trains with the legacy "
                        f"optimizers; use tf.keras.optimizers.legacy.{base.__name__} (docs/horovod.md)")
    prefix = name or f"Distributed{base.__name__}"
    divisor = passes if average_aggregated_gradients else 1

    def reduce(grads):
        grads = reduce_gradients(grads, prefix, **settings)
        return [g / divisor if g is not None and divisor != 1 else g for g in grads]

    def get_gradients(self, loss, params):
        grads = base.get_gradients(self, loss, params)
        if self._hvd_aggregation is None:
            return reduce(grads)
        return self._hvd_aggregation.gradients(grads, reduce)

    def get_updates(self, loss, params):
        grads = self.get_gradients(loss, params)
        pairs = list(zip(grads, params))
        if self._hvd_aggregation is None:
            return [self.apply_gradients(pairs)]
        with tf.init_scope():
            self._create_all_weights(params)     # slots outside the condition
        return [self._hvd_aggregation.apply(lambda: self.apply_gradients(pairs),
                                            lambda: self.iterations.assign_add(1))]

    cls = type(base.__name__, (base,), {"get_gradients": get_gradients, "get_updates": get_updates,
                                         "__doc__": f"{base.__name__}, its gradients all-reduced by Horovod's rule."})
    wrapped = cls.from_config(optimizer.get_config())
    from tf_keras.src.backend import track_variable
    wrapped._hvd_aggregation = Aggregation(passes, prefix, track_variable) if passes > 1 else None
    return wrapped
