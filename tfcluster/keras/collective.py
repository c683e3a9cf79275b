"""A compiled tf-keras model trained by all-reduce across TF_CONFIG's workers: each holds a copy, no ps.

TF 1.11-1.13 programs named ``CollectiveAllReduceStrategy`` in ``compile``;
TF 1.14 programs built and compiled the model in
``MultiWorkerMirroredStrategy``'s scope. Either way each worker held a full
copy of the model and every update was the mean of every worker's gradients.
A cluster fit of such a model (:mod:`.fit`, with no ps tasks) does that with
tfcluster's collective strategy (:mod:`tfcluster.strategies.collective`): the
clone's variables stay on this worker's CPU; the optimizer's gradients are
summed over the workers and divided by their number before it applies them
(:func:`~tfcluster.strategies.collective.mean_gradients`); model state the
step changes from the worker's own batch (batch-norm moving averages) is
averaged after it; the copies start as worker 0's (a broadcast) and are
compared at the end.

Batches follow TF 1.14's rule, as the towers of :mod:`.towers` do:
``fit(batch_size=B)`` is the global batch, so each of N workers steps on B/N
examples of its shard, and an update equals one process's on B examples. A
``tf.data.Dataset`` is batched already: each worker reads every N-th batch, so
an update holds N of them. A collective waits for every worker, so every
worker must take the same number of steps (:func:`even`).
"""

import logging

from ..core.errors import SpecError

log = logging.getLogger("tfcluster")

#: Set on a model whose compile asked for all-reduce across workers (``compile(distribute=...)``, a scope).
REQUEST = "_tfcluster_all_reduce"
#: tf-keras's default batch size in fit.
KERAS_BATCH = 32


def request(model) -> None:
    """Mark ``model`` to train by all-reduce when it fits on a cluster of several workers and no ps."""
    setattr(model, REQUEST, True)


def strategy_for(model, cluster):
    """tfcluster's collective strategy on ``cluster``'s trainers if ``model`` asked for all-reduce, else None."""
    from .. import strategies
    return strategies.for_request("collective" if getattr(model, REQUEST, False) else None, cluster)


def worker_batch(batch_size, n: int, x) -> int:
    """Each worker's share of the global ``batch_size`` (tf-keras's 32 when None); None for a dataset."""
    if _is_dataset(x):
        return batch_size
    batch = KERAS_BATCH if batch_size is None else batch_size
    if batch % n:
        raise SpecError(f"fit(batch_size={batch}) is the global batch under all-reduce, split over {n} workers: "
                        f"give a multiple of {n}")
    return batch // n


def even(data, n: int):
    """``data`` cut so every worker's shard (every n-th example or batch) is equally long: a multiple of ``n``.

    Arrays (and lists or dicts of them) lose at most ``n - 1`` examples at
    the end; a dataset of known length at most ``n - 1`` batches; a dataset
    of unknown or infinite length is left as it is (``steps_per_epoch`` then
    sets the steps).
    """
    if data is None:
        return None
    if _is_dataset(data):
        length = _length(data)
        return data.take(length - length % n) if length >= 0 and length % n else data
    if isinstance(data, dict):
        return {k: even(v, n) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(even(v, n) for v in data)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        return data[:len(data) - len(data) % n]
    return data


def _length(dataset) -> int:
    """How many elements ``dataset`` has (negative: infinite or unknown), read in the graph it was made in."""
    import tensorflow as tf
    cardinality = dataset.cardinality()
    if not tf.is_symbolic_tensor(cardinality):
        return int(cardinality)
    try:
        with tf.compat.v1.Session(graph=cardinality.graph) as session:
            return int(session.run(cardinality))
    except tf.errors.OpError:       # a pipeline fed at run time: its length is unknown here
        return -2


def _is_dataset(x) -> bool:
    import tensorflow as tf
    return isinstance(x, tf.compat.v1.compat.v2.data.Dataset)     # v1's and v2's (TF1 mode gives v1)


def model_state(model) -> list:
    """The variables a step changes from one worker's batch with no gradient (batch-norm moving averages)."""
    return [v for v in model.non_trainable_weights if v.dtype.base_dtype.is_floating]
