"""``tf.estimator`` for TF 1.x programs on TensorFlow 2.21, running on tfcluster's cluster.

TensorFlow removed ``tf.estimator`` in 2.16. This package is what TF1 mode
gives as ``tf.estimator`` (and new code imports as ``tfcluster.estimator``):
``Estimator`` with ``train``, ``evaluate``, ``predict`` and
``export_saved_model``; ``EstimatorSpec``, ``ModeKeys``, ``RunConfig`` (read
from TF_CONFIG); ``train_and_evaluate`` with ``TrainSpec`` and ``EvalSpec``;
``inputs.numpy_input_fn``; ``export`` (serving receivers, export outputs,
exporters); the session-run hooks of TF 1.x's ``tf.estimator`` namespace;
``model_to_estimator`` for compiled tf-keras models; and TF 1.x's canned
estimators, heads, ``add_metrics``, parsing specs, ``BestExporter`` and
``inputs.pandas_input_fn`` (:mod:`.canned`: tensorflow-estimator's own code on
this package's Estimator), with ``WarmStartSettings`` and ``VocabInfo``.
Training runs on tfcluster's session and loop (:mod:`.training_graph`);
``RunConfig`` takes TF1 mode's ``tf.contrib.distribute`` strategies where
tfcluster trains them as asked. What is not covered (boosted trees, TPU)
stops with one line naming what to use instead; docs/estimator.md lists both.

- :mod:`.spec`: ``EstimatorSpec`` and ``ModeKeys``; :mod:`.run_config`: ``RunConfig`` and this task's role;
- :mod:`.inputs`: ``numpy_input_fn``; :mod:`.calls`: calling ``input_fn`` and ``model_fn`` as TF 1.x did;
- :mod:`.replicas`: a ``model_fn`` on several replicas in one process, one update per step (MirroredStrategy);
- :mod:`.training_graph`: training a ``model_fn`` on tfcluster's session, placement and loop;
- :mod:`.inference`: ``evaluate`` and ``predict``; :mod:`.export`: SavedModels, receivers, exporters;
- :mod:`.warm_start`: ``warm_start_from``, ``WarmStartSettings``, ``VocabInfo``;
- :mod:`.estimator`: the ``Estimator`` class; :mod:`.training`: ``train_and_evaluate`` and its specs;
- :mod:`.keras`: ``model_to_estimator``; :mod:`.canned`: the canned estimators and heads.
"""

import types

import tensorflow as tf

from ..core.errors import TF1RemovedError
from ..strategies.sync_replicas import SyncReplicasOptimizer
from . import canned, export, inputs
from .estimator import Estimator
from .export import Exporter, FinalExporter, LatestExporter
from .keras import model_to_estimator
from .run_config import RunConfig
from .spec import EstimatorSpec, ModeKeys
from .training import EvalSpec, TrainSpec, train_and_evaluate
from .warm_start import VocabInfo, WarmStartSettings

_train = tf.compat.v1.train
# TF 1.x's tf.estimator exported these session-run hooks under its own name too.
CheckpointSaverHook = _train.CheckpointSaverHook
CheckpointSaverListener = _train.CheckpointSaverListener
FeedFnHook = _train.FeedFnHook
FinalOpsHook = _train.FinalOpsHook
GlobalStepWaiterHook = _train.GlobalStepWaiterHook
LoggingTensorHook = _train.LoggingTensorHook
NanLossDuringTrainingError = _train.NanLossDuringTrainingError
NanTensorHook = _train.NanTensorHook
ProfilerHook = _train.ProfilerHook
SecondOrStepTimer = _train.SecondOrStepTimer
SessionRunArgs = _train.SessionRunArgs
SessionRunContext = _train.SessionRunContext
SessionRunHook = _train.SessionRunHook
SessionRunValues = _train.SessionRunValues
StepCounterHook = _train.StepCounterHook
StopAtStepHook = _train.StopAtStepHook
SummarySaverHook = _train.SummarySaverHook

__all__ = ["Estimator", "EstimatorSpec", "ModeKeys", "RunConfig", "TrainSpec", "EvalSpec", "train_and_evaluate",
           "export", "inputs", "Exporter", "LatestExporter", "FinalExporter", "model_to_estimator",
           "SyncReplicasOptimizer", "WarmStartSettings", "VocabInfo", "CheckpointSaverHook", "CheckpointSaverListener", "FeedFnHook", "FinalOpsHook",
           "GlobalStepWaiterHook", "LoggingTensorHook", "NanLossDuringTrainingError", "NanTensorHook",
           "ProfilerHook", "SecondOrStepTimer", "SessionRunArgs", "SessionRunContext", "SessionRunHook",
           "SessionRunValues", "StepCounterHook", "StopAtStepHook", "SummarySaverHook", "experimental"]

_TREES = ("a DNN or linear canned estimator, or a model_fn of your own (tensorflow-estimator 2.15, where the "
          "canned estimators come from, no longer has boosted trees)")
#: What TF 1.x's tf.estimator had that is not covered, and what to use instead (docs/estimator.md).
NOT_COVERED = {
    "BoostedTreesClassifier": _TREES, "BoostedTreesRegressor": _TREES, "BoostedTreesEstimator": _TREES,
    "tpu": "nothing: TPUs are out of scope for tfcluster",
    "TPUEstimator": "nothing: TPUs are out of scope for tfcluster",
}


def _pandas_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None, queue_capacity=1000, num_threads=1,
                     target_column="target"):
    """TF 1.x's ``tf.estimator.inputs.pandas_input_fn`` (tensorflow-estimator's; pandas is the ``pandas`` extra)."""
    return canned.get("pandas_input_fn")(x, y, batch_size, num_epochs, shuffle, queue_capacity, num_threads,
                                         target_column)


# Set here, not in .inputs: it loads tensorflow-estimator (.canned), a room above .inputs.
inputs.pandas_input_fn = _pandas_input_fn
# tensorflow-estimator's own modules, as TF1 mode lets programs import them, hand the Estimator these classes (its
# canned classes, made before, keep their base: tfcluster's Estimator that says their ValueErrors in one line).
canned.PUBLIC.update(Estimator=Estimator, EstimatorV2=Estimator, RunConfig=RunConfig, TrainSpec=TrainSpec,
                     EvalSpec=EvalSpec, train_and_evaluate=train_and_evaluate, Exporter=Exporter,
                     LatestExporter=LatestExporter, FinalExporter=FinalExporter, numpy_input_fn=inputs.numpy_input_fn,
                     WarmStartSettings=WarmStartSettings, VocabInfo=VocabInfo)


class _Experimental(types.ModuleType):
    """TF 1.x's ``tf.estimator.experimental``: its early-stopping hooks; the rest is refused in one line."""

    def __getattr__(self, name):
        if name in canned.EXPERIMENTAL:
            return canned.get(name)
        if name.startswith("__"):
            raise AttributeError(name)
        raise TF1RemovedError(f"tf.estimator.experimental.{name}", "tf.estimator's stable API (of "
                              "tf.estimator.experimental only the early-stopping hooks are covered; docs/estimator.md)",
                              since="2.16")

    def __dir__(self):
        return sorted(canned.EXPERIMENTAL)


experimental = _Experimental("tf.estimator.experimental", _Experimental.__doc__)


def __getattr__(name):
    if name in canned.NAMES and name != "pandas_input_fn":
        return canned.get(name)
    if name in NOT_COVERED:
        raise TF1RemovedError(f"tf.estimator.{name}", f"{NOT_COVERED[name]} (docs/estimator.md)", since="2.16")
    raise AttributeError(f"module 'tf.estimator' (tfcluster) has no attribute {name!r}")

