"""What a ``model_fn`` returns (``EstimatorSpec``) and the modes it is asked for (``ModeKeys``), as in TF 1.x."""

import collections

import tensorflow as tf

from ..core.errors import ModelFnError


class ModeKeys:
    """The modes a ``model_fn`` is called in: ``TRAIN``, ``EVAL``, ``PREDICT`` (``"infer"``, as in TF 1.x)."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


_FIELDS = ["mode", "predictions", "loss", "train_op", "eval_metric_ops", "export_outputs",
           "training_chief_hooks", "training_hooks", "scaffold", "evaluation_hooks", "prediction_hooks"]


class EstimatorSpec(collections.namedtuple("EstimatorSpec", _FIELDS)):
    """Ops and objects returned from a ``model_fn`` (TF 1.x's ``tf.estimator.EstimatorSpec``).

    TRAIN needs ``loss`` and ``train_op``; EVAL needs ``loss`` (and takes
    ``eval_metric_ops``, ``{name: (value, update_op)}``); PREDICT needs
    ``predictions`` (a tensor or a dict of tensors).
    """

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,
                export_outputs=None, training_chief_hooks=None, training_hooks=None, scaffold=None,
                evaluation_hooks=None, prediction_hooks=None):
        if mode not in (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT):
            raise ModelFnError(f"EstimatorSpec: unknown mode {mode!r}; use tf.estimator.ModeKeys")
        if mode == ModeKeys.TRAIN and (loss is None or train_op is None):
            raise ModelFnError("EstimatorSpec in TRAIN mode needs loss and train_op")
        if mode == ModeKeys.EVAL and loss is None:
            raise ModelFnError("EstimatorSpec in EVAL mode needs loss")
        if mode == ModeKeys.PREDICT and predictions is None:
            raise ModelFnError("EstimatorSpec in PREDICT mode needs predictions")
        if loss is not None:
            loss = tf.convert_to_tensor(loss)
            if loss.shape.rank not in (None, 0) and loss.shape.num_elements() != 1:
                raise ModelFnError(f"EstimatorSpec: loss must be a scalar, got shape {loss.shape}")
            loss = tf.reshape(loss, []) if loss.shape.rank not in (None, 0) else loss
        metrics = dict(eval_metric_ops or {})
        for name, value in metrics.items():
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise ModelFnError(f"EstimatorSpec: eval_metric_ops[{name!r}] must be a (value, update_op) pair, as "
                                   "tf.metrics.* return")
        return super().__new__(cls, mode, predictions, loss, train_op, metrics, export_outputs,
                               tuple(training_chief_hooks or ()), tuple(training_hooks or ()),
                               scaffold or tf.compat.v1.train.Scaffold(), tuple(evaluation_hooks or ()),
                               tuple(prediction_hooks or ()))

    def _replace(self, **kwargs):
        """A copy with fields changed (validated again)."""
        return EstimatorSpec(**dict(self._asdict(), **kwargs))
