"""A model that makes its own update (an Estimator's ``model_fn`` returning a ``train_op``), under a strategy.

A Strategy builds the update itself from the loss ``model_fn`` returns
(:mod:`.base`). TF 1.x's Estimator handed that job to ``model_fn``: under
``RunConfig(train_distribute=...)`` it called ``model_fn`` once per replica,
and the optimizer's ``apply_gradients`` inside it summed the replicas'
gradients before one update. Here, as there: while the replicas are built, a
``tf.compat.v1.train.Optimizer`` divides the loss it differentiates by the
replicas in sync (TF 1.x's ``Optimizer._scale_loss`` for a mean loss) and
records its gradients instead of applying them (two context-scoped patches,
docs/patches.md); once every replica is built, each recorded update is
applied once with the towers' gradients summed (:func:`~.towers.sum_gradients`)
and, across workers, all-reduced by the collective strategy
(:meth:`~.collective.CollectiveAllReduceStrategy.reduce_gradients`). That is
the gradient of the mean loss over the global batch, as in every strategy.
"""

import contextlib

from ..core import patches
from ..core.errors import ModelFnError
from .towers import sum_gradients, tower_device_fn


def _scaled_compute(compute, replicas: int):
    def compute_gradients(self, loss, *args, **kwargs):
        return compute(self, loss * (1.0 / replicas), *args, **kwargs)
    return compute_gradients


def _recording_apply(_apply, recorded: list):
    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        import tensorflow as tf
        recorded[-1].append((self, list(grads_and_vars), global_step, name))
        return tf.no_op(name="replica_update")     # the update itself comes once, after every replica
    return apply_gradients


_WHO = "an Estimator's RunConfig(train_distribute=...) with several replicas or all-reduce, while model_fn builds"
patches.register(patches.Patch(
    "recorded.scaled_loss", "tensorflow.python.training.optimizer:Optimizer.compute_gradients",
    "while a model_fn builds N replicas in sync, a TF 1.x optimizer differentiates its loss / N (TF 1.x's "
    "Optimizer._scale_loss under a strategy)", _scaled_compute, _WHO, params=("self", "loss")))
patches.register(patches.Patch(
    "recorded.update", "tensorflow.python.training.optimizer:Optimizer.apply_gradients",
    "while a model_fn builds N replicas in sync, a TF 1.x optimizer's update is recorded, then applied once with "
    "the replicas' gradients combined", _recording_apply, _WHO,
    params=("self", "grads_and_vars", "global_step", "name")))


@contextlib.contextmanager
def recording(replicas: int, recorded: list):
    """While replicas build: TF 1.x optimizers scale their loss by 1/``replicas`` and append their updates to
    ``recorded[-1]`` instead of applying them."""
    with patches.applied("recorded.scaled_loss", replicas), patches.applied("recorded.update", recorded):
        yield


def apply_once(recorded: list, collective=None) -> list:
    """Each update the replicas asked for, applied once with their gradients summed per variable (and over every
    worker's, with ``collective``); the update ops."""
    import tensorflow as tf
    counts = {len(r) for r in recorded}
    if len(counts) != 1 or not recorded[0]:
        raise ModelFnError("model_fn must make the same optimizer updates on every replica "
                           f"(apply_gradients calls per replica: {[len(r) for r in recorded]})")
    updates = []
    for calls in zip(*recorded):
        optimizer, first, global_step, name = calls[0]
        summed = []
        for i, (_, var) in enumerate(first):
            grads = [call[1][i][0] for call in calls]
            summed.append((None if any(g is None for g in grads) else sum_gradients(grads), var))
        if collective is not None:
            summed = collective.reduce_gradients([(g, v) for g, v in summed if g is not None])
        updates.append(tf.compat.v1.train.Optimizer.apply_gradients(optimizer, summed, global_step=global_step,
                                                                    name=name))
    return updates


def on_towers(build_replica, devices, collective=None):
    """``build_replica(k)`` on each of ``devices`` (the first's variables shared by the others), its updates
    recorded; returns ``(what each build returned, the update ops)``: one update per step from every tower (and,
    with ``collective``, every worker)."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    if collective is not None:
        collective.start_graph()
    recorded, built = [], []
    with recording(len(devices) * (collective.num_workers if collective is not None else 1), recorded):
        for k, device in enumerate(devices):
            recorded.append([])
            # Compute on the replica's device; variables where the placement outside puts them (the ps).
            with tf1.variable_scope(tf1.get_variable_scope(), reuse=k > 0), tf1.name_scope(f"replica_{k}"), \
                    tf1.device(tower_device_fn(device, place_variables=False)):
                built.append(build_replica(k))
    return built, apply_once(recorded, collective)


def on_this_worker(build, collective):
    """``build()`` once on this worker's copy, its updates recorded; returns ``(what it returned, the update ops
    with every worker's gradients, or [] when it made none through a TF 1.x optimizer)``."""
    collective.start_graph()
    recorded = [[]]
    with recording(collective.num_workers, recorded):
        built = build()
    if not recorded[0]:
        return built, []
    return built, apply_once(recorded, collective)
