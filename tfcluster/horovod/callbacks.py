"""``horovod.tensorflow.keras.callbacks`` (and ``horovod.keras.callbacks``) for graph-mode tf-keras ``fit``.

Horovod's four callbacks, on tfcluster's collectives (:mod:`.tensorflow`);
their values are run in tf-keras's session, where the model trains. One
difference: the broadcast runs at ``on_train_begin`` (Horovod's ran after the
first batch, when TF 2's optimizer slots first exist); in graph mode every
variable exists by then, so no rank takes a step from its own initial weights.
"""

import tf_keras

from ..core.errors import SpecError
from . import tensorflow as hvd

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback", "LRScheduleCallback", "LRWarmupCallback"]

_K = tf_keras.backend


def _session():
    import tensorflow as tf
    return tf.compat.v1.keras.backend.get_session()


class BroadcastGlobalVariablesCallback(tf_keras.callbacks.Callback):
    """Every global variable set to ``root_rank``'s when training begins (after a restore too), once."""

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank, self.device, self.broadcast_done = root_rank, device, False

    def on_train_begin(self, logs=None):
        """Take the root's values before the first step."""
        if not self.broadcast_done:
            _session().run(hvd.broadcast_global_variables(self.root_rank))
            self.broadcast_done = True


class MetricAverageCallback(tf_keras.callbacks.Callback):
    """Each epoch's metrics replaced by their mean over the ranks, for the callbacks after this one."""

    def __init__(self, device=""):
        super().__init__()
        self.device, self._ops = device, {}

    def on_epoch_end(self, epoch, logs=None):
        """Average ``logs`` in place, metric by metric in name order (every rank runs the same collectives)."""
        import tensorflow as tf
        for metric, value in sorted((logs or {}).items()):
            if metric not in self._ops:
                fed = tf.compat.v1.placeholder(tf.float32, [], name=f"MetricAverageCallback_{metric}")
                self._ops[metric] = fed, hvd.allreduce(fed, name=f"MetricAverageCallback_{metric}_Allreduce")
            fed, mean = self._ops[metric]
            logs[metric] = float(_session().run(mean, {fed: float(value)}))


class LearningRateScheduleCallback(tf_keras.callbacks.Callback):
    """The learning rate set to ``initial_lr * multiplier(epoch)`` from ``start_epoch`` to ``end_epoch``.

    ``multiplier`` is a function of the (fractional, without ``staircase``)
    epoch, or a number: the rate times it (Horovod up to 0.27; 0.28 made a
    number ``multiplier ** (epoch - start_epoch)``); ``initial_lr`` defaults to
    the optimizer's rate when training begins (Horovod 0.16-0.19 had no such
    argument). Momentum is scaled by the rate's change for that batch
    (``momentum_correction``), as Horovod does after Goyal et al. (2017).
    """

    def __init__(self, initial_lr=None, multiplier=1.0, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None):
        super().__init__()
        self.initial_lr, self.start_epoch, self.end_epoch = initial_lr, start_epoch, end_epoch
        self.staircase, self.momentum_correction, self.steps_per_epoch = staircase, momentum_correction, \
            steps_per_epoch
        if not callable(multiplier):     # a number: that multiple of the rate, at each epoch's start
            self.staircase, self.multiplier = True, (lambda epoch: multiplier)
        else:
            self.multiplier = multiplier
        self.current_epoch, self.restore_momentum = None, None

    def on_train_begin(self, logs=None):
        """Take the optimizer's rate as the initial one if none was given; find the steps in an epoch."""
        if self.initial_lr is None:
            self.initial_lr = float(_K.get_value(self.model.optimizer.lr))
        if not self.staircase and not self.steps_per_epoch:
            steps, samples, batch = (self.params.get(k) for k in ("steps", "samples", "batch_size"))
            self.steps_per_epoch = steps or (samples // batch if samples and batch else None)
            if not self.steps_per_epoch:
                raise SpecError(f"{type(self).__name__}: give steps_per_epoch= (fit's data have no length)")

    def on_epoch_begin(self, epoch, logs=None):
        """Remember the epoch."""
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        """Set this batch's rate: at an epoch's first batch with ``staircase``, at every batch without."""
        if self.current_epoch < self.start_epoch or (self.end_epoch is not None and
                                                     self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def _adjust(self, epoch):
        optimizer = self.model.optimizer
        old = float(_K.get_value(optimizer.lr))
        new = self.initial_lr * self.multiplier(epoch)
        _K.set_value(optimizer.lr, new)
        if self.momentum_correction and hasattr(optimizer, "momentum") and old:
            self.restore_momentum = float(_K.get_value(optimizer.momentum))
            _K.set_value(optimizer.momentum, self.restore_momentum * new / old)

    def on_batch_end(self, batch, logs=None):
        """Put the momentum back after the corrected step."""
        if self.restore_momentum is not None:
            _K.set_value(self.model.optimizer.momentum, self.restore_momentum)
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        """Log the rate as ``lr``."""
        if logs is not None:
            logs["lr"] = float(_K.get_value(self.model.optimizer.lr))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """The rate raised from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``, a little every batch."""

    def __init__(self, initial_lr=None, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch       # round numbers at each epoch's end, as Horovod's
            return 1.0 / hvd.size() * (epoch * (hvd.size() - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        """Log the rate; say when the warmup ends (rank 0, with ``verbose``)."""
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and hvd.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{float(_K.get_value(self.model.optimizer.lr)):g}.")


#: Horovod 0.12-0.13's names of the two (its keras_mnist_advanced.py used LRWarmupCallback).
LRScheduleCallback, LRWarmupCallback = LearningRateScheduleCallback, LearningRateWarmupCallback
