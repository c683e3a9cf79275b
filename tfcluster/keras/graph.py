"""The cluster graph of a compiled tf-keras model: its clone, variables on the ps, built for the data it fits.

tf-keras's ``clone_and_build_model`` copies the model's structure and compile
arguments into a graph of its own, under byte-balanced ps placement
(:mod:`tfcluster.graph.placement`); a metric's running totals stay on this
worker. The optimizer's update counter is the global step, on the ps, so a
learning-rate schedule or a callback that reads ``optimizer.iterations`` reads
the updates of every worker. Before the session starts, every variable must
exist: tf-keras builds a model without an input shape, and adds its
sample-weight inputs, only when ``fit`` sees data, so the clone is first
prepared on one example of the data (:func:`prepare_for`), as tf-keras's own
``fit`` prepares it, then its train function is made and wrapped into the
step the training session runs (:class:`~.step.KerasStep`).
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from ..core.errors import SpecError
from ..data.pipeline import without_autotune_thread
from ..graph.placement import ByteBalancedSetter
from ..graph.step import TrainGraph
from ..strategies.collective import mean_gradients
from ..strategies.sync_replicas import for_keras
from ..strategies.sync_run import FinishingRunner
from .collective import model_state
from .step import KerasStep

tf1 = tf.compat.v1
#: Every tf.data.Dataset, of TF's v1 API or v2 (TF1 mode gives tfcluster's modules the v1 API too).
DATASET = tf1.compat.v2.data.Dataset


def _cloning():
    try:
        from tf_keras.src.models import cloning
        return cloning
    except ImportError:
        raise SpecError("graph-mode tf.keras needs the tf-keras package: pip install 'tfcluster[legacy]'") from None


@dataclass
class ClusterGraph:
    """What a cluster fit trains: the graph, the clone in it, the step tf-keras's loop runs, the TrainGraph."""

    graph: Any
    clone: Any
    step: KerasStep
    train_graph: TrainGraph
    x: Any = None       # the data to fit: the one given, or its dataset rebuilt in this graph


def _keep_metrics_local(worker_device):
    """A variable creator: a metric's running totals (ON_READ variables) stay on this worker."""
    def creator(next_creator, **kwargs):
        if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
            with tf1.device(worker_device):
                return next_creator(**kwargs)
        return next_creator(**kwargs)
    return creator


def _first(data):
    """One example of ``data`` (arrays, lists or dicts of them, a Dataset's element), or None."""
    if data is None:
        return None
    if isinstance(data, DATASET):
        # A batch of one, of zeros: only its structure, shapes and types matter.
        return tf.nest.map_structure(
            lambda spec: np.zeros([1 if n is None else n for n in spec.shape.as_list()], spec.dtype.as_numpy_dtype),
            data.element_spec)
    if isinstance(data, dict):
        return {k: _first(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_first(v) for v in data)
    if hasattr(data, "shape") and hasattr(data, "__getitem__"):
        return data[:1]
    return None


def into_graph(dataset, graph, device: str):
    """``dataset``, made in the program's graph, rebuilt in ``graph`` (its pipeline runs on ``device``).

    A graph-mode Dataset belongs to the graph it was made in, and the model's
    clone is in a graph of its own. The dataset's graph is serialized and read
    back with TF's own ``DatasetFromGraph`` (as tf.distribute moves datasets),
    from a local variable, not a constant: grappler folds a constant into a
    dataset it cannot pass on ("Cannot parse tensor from proto").
    """
    source = dataset._variant_tensor.graph
    try:
        with tf1.Session(graph=source) as session:
            definition = session.run(dataset._as_serialized_graph())
    except (tf.errors.OpError, ValueError) as e:
        raise SpecError(f"this tf.data.Dataset cannot be moved into the cluster's copy of the model: "
                        f"{str(e).splitlines()[0]}; fit on numpy arrays instead") from None
    with graph.as_default(), tf1.device(device):
        held = tf1.Variable(definition, dtype=tf.string, trainable=False, name="tfcluster_dataset",
                            collections=[tf1.GraphKeys.LOCAL_VARIABLES])
        moved = tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=held.read_value()),
                                                  dataset.element_spec)
        return without_autotune_thread(moved)


def prepare_for(clone, x, y=None, sample_weight=None, class_weight=None):
    """Build and compile ``clone`` for the data of a ``fit(x, y, ...)`` as tf-keras's ``fit`` would, on one example.

    A model whose input shape is known only from the data (a ``Sequential``
    without ``input_shape``) gets its variables here; sample or class weights
    get their inputs, so ``fit`` finds the train function it expects.
    """
    sample = _first(x)
    if isinstance(x, DATASET) and isinstance(sample, tuple):
        sample, y, sample_weight = (list(sample) + [None, None])[:3]
    elif sample is not None:
        y, sample_weight = _first(y), _first(sample_weight)
    if sample is None:
        if not clone.inputs:
            raise SpecError("a model without an input shape trains on a cluster from arrays or a tf.data.Dataset "
                            f"(it learns its shape from them), not from {type(x).__name__}; give its first layer "
                            "an input_shape")
        return
    _, _, weights = clone._standardize_user_data(sample, y, sample_weight=sample_weight, class_weight=class_weight)
    clone._update_sample_weight_modes(sample_weights=weights)


def build(model, cluster, sync: bool, x=None, y=None, sample_weight=None, class_weight=None,
          collective=None) -> ClusterGraph:
    """The cluster graph of the compiled ``model`` for this task of ``cluster``, async or ``sync``; with
    ``collective`` (a bound collective strategy), this worker's own copy, all-reduced (:mod:`.collective`)."""
    if not getattr(model, "_is_graph_network", False) and not isinstance(model, _sequential()):
        raise SpecError("a tf.keras model trains on a cluster when it is Sequential or functional; a subclassed "
                        "model cannot be cloned into the cluster's graph (build it with tf.keras.Model(inputs, "
                        "outputs), or write a model_fn for tfcluster.fit)")
    import tf_keras
    if isinstance(model.optimizer, tf_keras.optimizers.Optimizer):
        name = type(model.optimizer).__name__
        raise SpecError(f"tf_keras.optimizers.{name} is eager-only; a graph-mode model trains with "
                        f"tf_keras.optimizers.legacy.{name} (or a name: compile(optimizer='{name.lower()}'), or a "
                        "tf.compat.v1.train optimizer)")
    worker = cluster.task.device
    trainers = cluster.trainers()
    graph = tf1.Graph()
    if isinstance(x, DATASET):
        x = into_graph(x, graph, worker)
    placement = collective.host if collective is not None else ByteBalancedSetter.for_cluster(cluster)
    with graph.as_default(), tf1.device(placement), tf1.variable_creator_scope(_keep_metrics_local(worker)):
        clone = _cloning().clone_and_build_model(model, compile_clone=True)
        synced = for_keras(clone.optimizer, trainers, trainers.index(cluster.task)) if sync else None
        prepare_for(clone, x, y, sample_weight, class_weight)
        if collective is None:
            clone._make_train_function()
        else:
            collective.start_graph()
            with mean_gradients(clone.optimizer, collective):
                clone._make_train_function()
        # The optimizer's own counter, on the ps: tf-keras checkpoints it with the model (optimizer/iter).
        global_step = clone.optimizer.iterations
        if synced is not None:
            synced.release()
        # The chief initialises or restores the shared variables; tf-keras must never initialise (reset) them.
        for v in tf1.global_variables():
            v._keras_initialized = True
        after = []
        state = model_state(clone) if collective is not None and collective.num_workers > 1 else []
        if state:       # each worker moved it from its own batch: the mean, as MultiWorkerMirroredStrategy's
            with tf1.name_scope("tfcluster_average_state"):
                after.append(collective.average_state(state, [clone.train_function.updates_op]))
        step = KerasStep(clone.train_function, global_step, after=after)
        runner, hooks = collective.finish_graph(None, None, runner=step) if collective is not None else (step, [])
        totals = [v for m in clone.metrics for v in m.variables]
        train_graph = TrainGraph(runner, global_step, clone.total_loss,
                                 local_init_ops=[tf1.variables_initializer(totals)], hooks=hooks, model=clone)
        if synced is not None:
            sync_graph = synced.graph
            train_graph.runner = FinishingRunner(step, [synced.finish])
            train_graph.state_variables += sync_graph.state_variables
            train_graph.local_init_ops.append(sync_graph.local_step_init)
            train_graph.chief_local_init_ops += sync_graph.chief_init_ops()
    return ClusterGraph(graph, clone, step, train_graph, x)


def _sequential():
    import tf_keras
    return tf_keras.Sequential
