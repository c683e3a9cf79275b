"""Replicas of a ``model_fn``, one update per step from all of them: TF 1.x's Estimator under a strategy.

TF 1.x's Estimator with ``RunConfig(train_distribute=MirroredStrategy(num_gpus=N))``
called ``model_fn`` once per replica, each on its own device and its own batch
from ``input_fn`` (the batch ``input_fn`` makes is a replica's), and the
optimizer's ``apply_gradients`` inside ``model_fn`` summed the replicas'
gradients before one update. Here, as there: while the replicas are built, a
``tf.compat.v1.train.Optimizer`` divides the loss it differentiates by N (TF
1.x's ``Optimizer._scale_loss`` for a mean loss) and records its gradients
instead of applying them; once every replica is built, each recorded update
is applied once with the replicas' gradients summed, which is the gradient of
the mean loss over the global batch (N x the replica's batch). Replicas after
the first share the first's variables (``variable_scope(reuse=True)``, as the
TF1 tower programs did), which live where the placement outside the replicas
puts them: the first replica's device in one process, the ps tasks on a
cluster (``ParameterServerStrategy(num_gpus_per_worker=N)``: each worker's
replicas make one update of the shared variables per step).

Without GPUs the N replicas run on N virtual CPU devices, as tfcluster's own
towers do (:class:`~tfcluster.strategies.towers.Towers`). A tf-keras
model (``model_to_estimator``'s) creates new variables on each call, so its
model_fn is called once, on every replica's batch at once, and splits it over
towers itself (:data:`SPLITS_ITSELF`); across TF_CONFIG's workers its towers'
gradient is then all-reduced as below, and on ps tasks it is refused in one
line (:func:`refuse_for_keras`).

Across TF_CONFIG's workers (``CollectiveAllReduceStrategy``), each worker
builds ``model_fn`` once on its own copy of the variables, the same way:
its recorded gradients, scaled by 1/workers, are summed over every worker by
tfcluster's collective strategy (:mod:`tfcluster.strategies.collective`: one
all-reduce per dtype, worker 0's variables broadcast at each session start,
the copies compared at the end) and applied on each copy (:func:`build_collective`).
``model_to_estimator``'s model_fn with a tf-keras optimizer averages its
gradients over the workers itself (:func:`keras_update`).
"""

import contextlib
import logging

import tensorflow as tf

from ..core.errors import ModelFnError, SpecError
from ..graph.model import split_element
from ..strategies.collective import mean_gradients
from ..strategies.towers import sum_gradients, tower_device_fn
from .calls import call_estimator_model_fn
from .spec import EstimatorSpec, ModeKeys

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")


def replicas_of(config) -> int:
    """How many replicas of ``model_fn`` one training process builds for ``config`` (its train_distribute)."""
    strategy, cluster = config.train_distribute, config.cluster
    if strategy is None:
        return 1
    kind = getattr(strategy, "kind", None)
    if cluster is None or kind == "collective" or (kind == "ps" and cluster.num_tasks("ps")):
        return strategy.replicas_per_worker     # in one process, or on each worker of a ps or all-reduce cluster
    return 1


def towers_for(config):
    """The replicas' devices: the strategy's named devices, else N GPUs, else N virtual CPU devices."""
    return config.train_distribute.towers()


#: Set on a model_fn that splits its batch over the replicas itself (``model_to_estimator``'s: a tf-keras model
#: makes new variables on each call, so it is called once, on every replica's batch, and builds towers).
SPLITS_ITSELF = "_tfcluster_splits_over_replicas"


def refuse_for_keras(config):
    """``model_to_estimator`` takes several replicas in one process or per all-reduce worker: say in one line that
    a ps cluster's are not."""
    strategy = config.train_distribute if config is not None else None
    if strategy is not None and replicas_of(config) > 1 and config.cluster is not None \
            and getattr(strategy, "kind", None) != "collective":
        raise SpecError(f"model_to_estimator with {strategy.describe()} on a cluster is not covered yet; write a "
                        "model_fn, which RunConfig(train_distribute=...) runs on every replica of each worker, or "
                        "give the strategy one device (docs/tf1.md)")


@contextlib.contextmanager
def _one_update(replicas: int, recorded: list):
    """While replicas build: TF 1.x optimizers scale their loss by 1/replicas and record, not apply, updates."""
    optimizer = tf1.train.Optimizer
    compute, apply = optimizer.compute_gradients, optimizer.apply_gradients

    def scaled_compute(self, loss, *args, **kwargs):
        return compute(self, loss * (1.0 / replicas), *args, **kwargs)

    def recording_apply(self, grads_and_vars, global_step=None, name=None):
        recorded[-1].append((self, list(grads_and_vars), global_step, name))
        return tf.no_op(name="replica_update")     # the update itself comes once, after every replica

    optimizer.compute_gradients, optimizer.apply_gradients = scaled_compute, recording_apply
    try:
        yield
    finally:
        optimizer.compute_gradients, optimizer.apply_gradients = compute, apply


def _apply_once(recorded: list, collective=None):
    """Each update the replicas asked for, applied once with their gradients summed per variable (and over every
    worker's, with ``collective``)."""
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
        updates.append(tf1.train.Optimizer.apply_gradients(optimizer, summed, global_step=global_step, name=name))
    return updates


def input_context(config):
    """The ``tf.distribute.InputContext`` TF 1.x gave an ``input_fn`` that takes one, under a strategy (else None):
    this worker's pipeline of the workers', and the replicas in sync."""
    strategy, cluster = config.train_distribute, config.cluster
    if strategy is None:
        return None
    workers = cluster.num_replicas if cluster is not None and collective_of(config) is not None else 1
    index = cluster.trainers().index(cluster.task) if workers > 1 else 0
    return tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=index,
                                      num_replicas_in_sync=workers * strategy.replicas_per_worker)


def collective_of(config):
    """tfcluster's collective strategy on TF_CONFIG's workers when ``train_distribute`` asks for all-reduce across
    several of them (``CollectiveAllReduceStrategy``), else None."""
    strategy, cluster = config.train_distribute, config.cluster
    if strategy is None or getattr(strategy, "kind", None) != "collective" or cluster is None \
            or cluster.num_replicas < 2:
        return None
    from ..strategies.collective import CollectiveAllReduceStrategy
    return CollectiveAllReduceStrategy().bind(cluster, idle_ps=True)     # the ps tasks serve_as_ps and exit


#: The collective strategy whose graph a model_fn is being built in (for :func:`keras_update`), and whether a
#: tf-keras optimizer's gradients were all-reduced in it.
_BUILDING = {"collective": None, "reduced": False}


def keras_update(optimizer):
    """Around a tf-keras train function made in a model_fn (``model_to_estimator``'s): under all-reduce, a tf-keras
    optimizer's gradients are the workers' mean. A ``tf.compat.v1.train`` one is :func:`build_collective`'s."""
    collective = _BUILDING["collective"]
    inner = getattr(optimizer, "optimizer", None)
    if collective is None or isinstance(inner, tf1.train.Optimizer):
        return contextlib.nullcontext()
    _BUILDING["reduced"] = True
    return mean_gradients(optimizer, collective)


def build_collective(model_fn, features, labels, params, config, collective):
    """The TRAIN spec of ``model_fn`` on this worker's copy: its update applied with every worker's gradients."""
    collective.start_graph()
    recorded = [[]]
    _BUILDING.update(collective=collective, reduced=False)
    try:
        with _one_update(collective.num_workers, recorded):
            spec = call_estimator_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params, config)
    finally:
        _BUILDING["collective"] = None
    if _BUILDING["reduced"]:
        return spec
    if not recorded[0]:
        raise ModelFnError("with CollectiveAllReduceStrategy, model_fn's update must come from a "
                           "tf.compat.v1.train optimizer (its apply_gradients is where the workers' gradients are "
                           "summed); a tf-keras optimizer's in a model_fn of your own is not (model_to_estimator's "
                           "is)")
    updates = []
    for optimizer, grads_and_vars, global_step, name in recorded[0]:
        summed = collective.reduce_gradients([(g, v) for g, v in grads_and_vars if g is not None])
        updates.append(tf1.train.Optimizer.apply_gradients(optimizer, summed, global_step=global_step, name=name))
    return spec._replace(train_op=tf.group(*updates, spec.train_op, name="allreduce_train_op"))


def build_replicas(model_fn, iterator, features, labels, params, config, towers, collective=None) -> EstimatorSpec:
    """The TRAIN spec of ``model_fn`` over ``towers``: replica 0 reads ``features``/``labels``, the others read on;
    with ``collective``, their summed gradients are all-reduced over the workers before the one update."""
    if iterator is None:
        raise SpecError(f"with {config.train_distribute.describe()}, input_fn must return a tf.data.Dataset "
                        "(each replica reads its own batch of it), not tensors")
    recorded, specs = [], []
    devices = towers.local_devices
    if getattr(model_fn, SPLITS_ITSELF, False):
        # Each replica's batch, as the replicas below would read them, in one batch the model_fn splits again.
        batches = [(features, labels)] + [split_element(iterator.get_next()) for _ in devices[1:]]
        features, labels = (None if parts[0] is None else tf.nest.map_structure(lambda *t: tf.concat(t, 0), *parts)
                            for parts in zip(*batches))
        log.info("model_fn runs on %s, one update per step from all of them", towers.describe())
        if collective is not None:          # the towers' mean gradient, then the workers' mean of those
            return build_collective(model_fn, features, labels, params, config, collective)
        return call_estimator_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params, config)
    if collective is not None:
        collective.start_graph()
    with _one_update(len(devices) * (collective.num_workers if collective is not None else 1), recorded):
        for k, device in enumerate(devices):
            recorded.append([])
            if k:
                features, labels = split_element(iterator.get_next())
            # Compute on the replica's device; variables where the placement outside puts them (the ps).
            with tf1.variable_scope(tf1.get_variable_scope(), reuse=k > 0), tf1.name_scope(f"replica_{k}"), \
                    tf1.device(tower_device_fn(device, place_variables=False)):
                specs.append(call_estimator_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params, config))
    updates = _apply_once(recorded, collective)
    first = specs[0]
    loss = tf.add_n([s.loss for s in specs]) / len(specs)        # TF 1.x reported the replicas' mean loss
    train_op = tf.group(*updates, *[s.train_op for s in specs], name="replicas_train_op")
    log.info("model_fn runs on %s, one update per step from all of them", towers.describe())
    return first._replace(loss=loss, train_op=train_op)
