"""Keras's progress on several trainers is one process's: mid-epoch loss and metrics, not N times them.

tf-keras 2.21's ``fit`` reduces what each step returns with
``reduce_per_replica(..., "auto")``, which is ``"sum"`` on any strategy but a
TPU's; under ``MultiWorkerMirroredStrategy`` it sums with a cross-worker
all-reduce. A metric's result is already the cluster's (tf-keras merges it over
every replica before returning it), so the sum counts it once per trainer: on 2
trainers the progress bar and the callbacks' ``logs`` print twice the loss and
accuracy mid-epoch (the epoch-end values, read another way, are right). In one
process ``"sum"`` leaves such a synchronized value alone and adds only values
that differ per replica. TF2 mode makes the multi-worker reduction do the same:
a synchronized value is taken as it is, a per-replica one summed over every
replica of the cluster, as one process sums over its devices.
"""

from ..core.patches import Patch, register


def as_one_process(original):
    """tf-keras's ``reduce_per_replica``: ``"auto"`` under a multi-worker strategy reduces as in one process."""
    def reduce_per_replica(values, strategy, reduction):
        if reduction != "auto":
            return original(values, strategy, reduction)
        import tensorflow as tf
        from tf_keras.src.engine import training
        if not training._collective_all_reduce_multi_worker(strategy):
            return original(values, strategy, reduction)
        return tf.nest.map_structure(
            lambda value: original(value, strategy, "sum" if training._is_per_replica_instance(value) else "first"),
            values)
    return reduce_per_replica


register(Patch("tf2.progress_as_one_process", "tf_keras.src.engine.training:reduce_per_replica",
               "on several trainers, what Keras's fit prints mid-epoch is what one process prints, not N times it",
               as_one_process, "TF2 mode, where tf-keras is installed", params=("values", "strategy", "reduction"),
               optional=True))

#: The patches of this module TF2 mode installs.
PATCHES = ("tf2.progress_as_one_process",)
