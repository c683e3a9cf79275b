"""Replicas of a ``model_fn``, one update per step from all of them: TF 1.x's Estimator under a strategy.

TF 1.x's Estimator with ``RunConfig(train_distribute=MirroredStrategy(num_gpus=N))``
called ``model_fn`` once per replica, each on its own device and its own batch
from ``input_fn`` (the batch ``input_fn`` makes is a replica's), and the
optimizer's ``apply_gradients`` inside ``model_fn`` summed the replicas'
gradients before one update. Here, as there, through the strategy layer's
adapter for a model that makes its own update
(:mod:`tfcluster.strategies.recorded`: the loss scaled by 1/N, the updates
recorded, then applied once with the replicas' gradients summed): the
gradient of the mean loss over the global batch (N x the replica's batch). Replicas after
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

from .. import strategies
from ..core.errors import ModelFnError, SpecError
from ..graph.model import split_element
from ..strategies.collective import mean_gradients
from ..strategies.recorded import on_this_worker, on_towers
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


def towers_of(config):
    """The replicas' devices when ``config`` asks for several per training process (the strategy's named devices,
    else N GPUs, else N virtual CPU devices), else None."""
    return config.train_distribute.towers() if replicas_of(config) > 1 else None


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
    kind = getattr(config.train_distribute, "kind", None)
    return strategies.for_request(kind, config.cluster, idle_ps=True)     # the ps tasks serve_as_ps and exit


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
    _BUILDING.update(collective=collective, reduced=False)
    try:
        spec, updates = on_this_worker(
            lambda: call_estimator_model_fn(model_fn, features, labels, ModeKeys.TRAIN, params, config), collective)
    finally:
        _BUILDING["collective"] = None
    if _BUILDING["reduced"]:
        return spec
    if not updates:
        raise ModelFnError("with CollectiveAllReduceStrategy, model_fn's update must come from a "
                           "tf.compat.v1.train optimizer (its apply_gradients is where the workers' gradients are "
                           "summed); a tf-keras optimizer's in a model_fn of your own is not (model_to_estimator's "
                           "is)")
    return spec._replace(train_op=tf.group(*updates, spec.train_op, name="allreduce_train_op"))


def build_replicas(model_fn, iterator, features, labels, params, config, towers, collective=None) -> EstimatorSpec:
    """The TRAIN spec of ``model_fn`` over ``towers``: replica 0 reads ``features``/``labels``, the others read on;
    with ``collective``, their summed gradients are all-reduced over the workers before the one update."""
    if iterator is None:
        raise SpecError(f"with {config.train_distribute.describe()}, input_fn must return a tf.data.Dataset "
                        "(each replica reads its own batch of it), not tensors")
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

    def replica(k):
        batch = (features, labels) if k == 0 else split_element(iterator.get_next())
        return call_estimator_model_fn(model_fn, *batch, ModeKeys.TRAIN, params, config)

    specs, updates = on_towers(replica, devices, collective)
    first = specs[0]
    loss = tf.add_n([s.loss for s in specs]) / len(specs)        # TF 1.x reported the replicas' mean loss
    train_op = tf.group(*updates, *[s.train_op for s in specs], name="replicas_train_op")
    log.info("model_fn runs on %s, one update per step from all of them", towers.describe())
    return first._replace(loss=loss, train_op=train_op)
