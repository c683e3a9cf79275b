"""``tf.keras.estimator.model_to_estimator``: an Estimator from a compiled graph-mode tf-keras model.

As TF 1.x did it: the Estimator's ``model_fn`` clones the model's structure
onto the input tensors (tf-keras's ``clone_and_build_model``), compiled as the
original was, with the optimizer's iteration counter as the global step; the
predictions are the model's outputs by output name, the loss its compiled
loss, the metrics its compiled metrics, and the first training starts from
the original model's weights. Under tfcluster the clone's variables land on
the ps tasks like any Estimator's. Subclassed models are refused (their
structure cannot be cloned onto new inputs).
"""

import logging
import warnings

import tensorflow as tf

from ..core.errors import ModelFnError, SpecError
from .estimator import Estimator
from ..strategies.keras_towers import tower_model
from .replicas import SPLITS_ITSELF, keras_update, refuse_for_keras, towers_of
from .spec import EstimatorSpec, ModeKeys

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")


def _keras():
    try:
        import tf_keras
        from tf_keras.src.models import cloning
    except ImportError:
        raise SpecError("model_to_estimator needs the tf-keras package (graph-mode tf.keras on TF 2.21): "
                        "pip install 'tfcluster[legacy]'") from None
    return tf_keras, cloning


def _inputs(model, features):
    """The model's input tensors from ``features``: a tensor, or a dict keyed by input names."""
    names = list(model.input_names)
    if isinstance(features, dict):
        missing = [n for n in names if n not in features]
        if missing and len(names) == 1 and len(features) == 1:
            return [next(iter(features.values()))]
        if missing:
            raise ModelFnError(f"input_fn's features {sorted(features)} lack the model's inputs {missing}")
        return [features[n] for n in names]
    if len(names) != 1:
        raise ModelFnError(f"the model has {len(names)} inputs {names}: input_fn must give a dict keyed by them")
    return [features]


def _targets(model, labels):
    if labels is None:
        return None
    names = list(model.output_names)
    if isinstance(labels, dict):
        return [labels[n] for n in names]
    return [labels]


def _metric_ops(clone, labels):
    """The compiled metrics as ``{name: (value, update_op)}`` over the clone's single output."""
    metrics = list(getattr(clone, "_compile_metric_functions", []) or [])
    if not metrics or labels is None:
        return {}
    if len(clone.outputs) != 1:
        log.warning("model_to_estimator: the metrics of a model with %d outputs are not evaluated (loss only)",
                    len(clone.outputs))
        return {}
    target = labels if not isinstance(labels, dict) else next(iter(labels.values()))
    ops = {}
    for m in metrics:
        update = m.update_state(target, clone.outputs[0])
        ops[m.name] = (m.result(), update)
        for v in m.variables:   # tf-keras keeps them out of every collection: evaluation initialises local ones
            tf1.add_to_collection(tf1.GraphKeys.LOCAL_VARIABLES, v)
    return ops


def _warm_start(clone, weights):
    """A Scaffold whose init_fn gives the clone the original model's weights (when no checkpoint is restored)."""
    feeds, assigns = {}, []
    for v, value in zip(clone.weights, weights):
        ph = tf1.placeholder(v.dtype.base_dtype, shape=value.shape)
        feeds[ph] = value
        assigns.append(v.assign(ph))
    op = tf.group(*assigns)
    return tf1.train.Scaffold(init_fn=lambda scaffold, session: session.run(op, feeds))


def _towers(clone, features, targets, towers):
    """``clone`` as a model of ``towers`` on ``features``, compiled as the clone was (its optimizer, its loss)."""
    split = tower_model(clone, towers.local_devices, tensors=_inputs(clone, features))
    split.compile(optimizer=clone.optimizer, loss=clone.loss, loss_weights=clone.loss_weights,
                  sample_weight_mode=clone.sample_weight_mode, target_tensors=targets)
    return split


def _make_model_fn(model, weights, custom_objects, export_outputs):
    _, cloning = _keras()
    backend = __import__("tf_keras").backend

    def model_fn(features, labels, mode, config):
        with warnings.catch_warnings():     # TF 1.x's way to say train or not, deprecated by tf-keras
            warnings.simplefilter("ignore")
            backend.set_learning_phase(1 if mode == ModeKeys.TRAIN else 0)
        targets = _targets(model, labels) if mode != ModeKeys.PREDICT else None
        clone = cloning.clone_and_build_model(
            model, _inputs(model, features), targets, custom_objects=custom_objects,
            compile_clone=mode != ModeKeys.PREDICT, optimizer_iterations=tf1.train.get_or_create_global_step())
        names = list(clone.output_names)
        predictions = dict(zip(names, clone.outputs)) if len(names) > 1 else {names[0]: clone.outputs[0]}
        outputs = None
        if export_outputs:
            outputs = {k: cls(predictions[k]) for k, cls in export_outputs.items()}
        if mode == ModeKeys.PREDICT:
            return EstimatorSpec(mode, predictions=predictions, export_outputs=outputs)
        loss = clone.total_loss
        if mode == ModeKeys.EVAL:
            return EstimatorSpec(mode, predictions=predictions, loss=loss, eval_metric_ops=_metric_ops(clone, labels))
        # Several replicas (build_replicas gives every replica's batch at once): towers of the clone train.
        towers = towers_of(config)
        trained = _towers(clone, features, targets, towers) if towers is not None else clone
        with keras_update(trained.optimizer):      # all-reduced across the workers under CollectiveAllReduce
            trained._make_train_function()
        return EstimatorSpec(mode, predictions=predictions, loss=trained.total_loss,
                             train_op=trained.train_function.updates_op, scaffold=_warm_start(clone, weights),
                             export_outputs=outputs)
    setattr(model_fn, SPLITS_ITSELF, True)
    return model_fn


def model_to_estimator(keras_model=None, keras_model_path=None, custom_objects=None, model_dir=None, config=None,
                       checkpoint_format="saver", metric_names_map=None, export_outputs=None):
    """An Estimator that trains, evaluates and predicts with a compiled tf-keras model's structure."""
    tf_keras, _ = _keras()
    if (keras_model is None) == (keras_model_path is None):
        raise SpecError("model_to_estimator takes keras_model or keras_model_path, one of them")
    if keras_model is None:
        keras_model = tf_keras.models.load_model(keras_model_path, custom_objects=custom_objects)
    if not getattr(keras_model, "_is_graph_network", False):
        raise SpecError("model_to_estimator takes Sequential and functional models; a subclassed model cannot be "
                        "cloned onto new inputs (write a model_fn that calls it instead)")
    if getattr(keras_model, "optimizer", None) is None:
        raise SpecError("model_to_estimator needs a compiled model: call model.compile(optimizer, loss) first")
    if metric_names_map:
        raise SpecError("model_to_estimator(metric_names_map=...) is not covered (docs/estimator.md)")
    refuse_for_keras(config)
    weights = keras_model.get_weights()
    model_fn = _make_model_fn(keras_model, weights, custom_objects, export_outputs)
    return Estimator(model_fn, model_dir=model_dir, config=config)
