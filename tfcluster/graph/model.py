"""The model contract: what a user writes, and how its loss becomes the global batch's loss.

A user writes ``model_fn(features, labels, mode) -> ModelOutput`` with a loss
*per example*, and ``input_fn(ctx: InputContext) -> tf.data.Dataset``. Every
replica's loss is the sum of its per-example losses divided by the **global**
batch (per-replica batch x replicas in sync), and regularisation divided by
the replicas, so that the replicas' gradients add up to the gradient of the
global batch's mean loss (the tutorials' rule, docs/pitfalls.md and the
README's "Training" section). ``fit``, ``evaluate``, ``predict`` and every
strategy use this module; it imports TensorFlow only when a graph is built.
"""

from dataclasses import dataclass, field
from typing import Any, Optional

from ..core.errors import ModelFnError


class Mode:
    """What ``model_fn`` is asked to build: ``Mode.TRAIN``, ``Mode.EVAL`` or ``Mode.PREDICT``."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "predict"


@dataclass
class ModelOutput:
    """What ``model_fn`` returns.

    - ``predictions``: a tensor or a dict of tensors, one row per example.
    - ``per_example_loss``: shape ``[batch]`` (or ``[batch, ...]``, summed per
      example); tfcluster divides its sum by the global batch. Never a mean.
      Required for TRAIN and EVAL.
    - ``metrics``: ``{name: (value, update_op)}`` as ``tf.compat.v1.metrics.*``
      return them; evaluated by ``evaluate`` and the evaluator.
    - ``regularization_loss``: a scalar added once per step (divided by the
      replicas); None takes the graph's REGULARIZATION_LOSSES.
    """

    predictions: Any = None
    per_example_loss: Any = None
    metrics: dict = field(default_factory=dict)
    regularization_loss: Any = None


@dataclass(frozen=True)
class InputContext:
    """What ``input_fn(ctx)`` needs to read this worker's shard at the right batch size."""

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    per_replica_batch: Optional[int] = None
    num_replicas_in_sync: int = 1

    @property
    def global_batch(self) -> Optional[int]:
        """Examples in one global step: per-replica batch x replicas in sync."""
        return None if self.per_replica_batch is None else self.per_replica_batch * self.num_replicas_in_sync

    def shard(self, dataset):
        """This pipeline's shard of ``dataset`` (every n-th element, offset by its id)."""
        if self.num_input_pipelines == 1:
            return dataset
        return dataset.shard(self.num_input_pipelines, self.input_pipeline_id)


@dataclass(frozen=True)
class ReplicaContext:
    """One replica's place in the step: how many replicas share it, which one this is, the batch."""

    num_replicas: int = 1
    replica_index: int = 0
    per_replica_batch: Optional[int] = None

    @property
    def global_batch(self) -> Optional[int]:
        """Examples in one global step, or None when the batch is only known at run time."""
        return None if self.per_replica_batch is None else self.per_replica_batch * self.num_replicas


# ------------------------------------------------------------------ input
def make_dataset(input_fn, ctx: InputContext):
    """``input_fn(ctx)``, checked to be a ``tf.data.Dataset``; its big numpy arrays stay out of the graph."""
    import tensorflow as tf

    from ..data.pipeline import arrays_outside_the_graph  # it imports numpy, which the CLI does without
    with arrays_outside_the_graph():
        ds = input_fn(ctx)
    if not isinstance(ds, tf.data.Dataset):
        raise ModelFnError(f"input_fn must return a tf.data.Dataset, got {type(ds).__name__}")
    return ds


def split_element(element):
    """``(features, labels)`` of a dataset element; labels None when the element is features only."""
    if isinstance(element, (tuple, list)) and len(element) == 2:
        return element[0], element[1]
    return element, None


# ------------------------------------------------------------------ model
def call_model_fn(model_fn, features, labels, mode) -> ModelOutput:
    """Call ``model_fn`` and check what it returned, naming the problem when it is wrong."""
    out = model_fn(features, labels, mode)
    if not isinstance(out, ModelOutput):
        raise ModelFnError(f"model_fn must return tfcluster.ModelOutput, got {type(out).__name__}")
    if mode in (Mode.TRAIN, Mode.EVAL):
        loss = out.per_example_loss
        if loss is None:
            raise ModelFnError(f"model_fn returned no per_example_loss in {mode} mode")
        if loss.shape.rank == 0:
            raise ModelFnError(
                "model_fn returned a scalar loss; return the loss per example (shape [batch]) and "
                "tfcluster divides its sum by the global batch")
    if mode == Mode.PREDICT and out.predictions is None:
        raise ModelFnError("model_fn returned no predictions in predict mode")
    return out


def metric_updates(out: ModelOutput) -> list:
    """The update ops of ``model_fn``'s metrics: in training they run with every step (``fit`` reports them)."""
    return [pair[1] for pair in (out.metrics or {}).values() if isinstance(pair, (tuple, list)) and len(pair) == 2]


def per_example_losses(out: ModelOutput):
    """The per-example loss as float32 of shape ``[batch]`` (extra dimensions summed per example)."""
    import tensorflow as tf
    per_example = tf.cast(out.per_example_loss, tf.float32)
    if per_example.shape.rank is None:      # a py_function's output: its rank is known when the step runs
        flat = tf.reshape(per_example, tf.stack([tf.shape(per_example)[0], -1]))
        return tf.reduce_sum(flat, axis=1)
    if per_example.shape.rank > 1:
        per_example = tf.reduce_sum(per_example, axis=list(range(1, per_example.shape.rank)))
    return per_example


def replica_loss(out: ModelOutput, ctx: ReplicaContext, reg_scope: Optional[str] = None):
    """``(scaled_loss, mean_loss)`` of one replica.

    ``scaled_loss`` is what the replica differentiates: the sum of its
    per-example losses over the GLOBAL batch, plus regularisation over the
    replicas, so that summing the replicas' gradients gives the gradient of
    the global batch's mean loss. ``mean_loss`` is the replica's own mean, for
    progress lines and summaries.
    """
    import tensorflow as tf
    tf1 = tf.compat.v1
    per_example = per_example_losses(out)
    total = tf.reduce_sum(per_example)
    if ctx.global_batch is not None:
        global_batch = tf.constant(float(ctx.global_batch))
    else:
        global_batch = tf.cast(tf.shape(per_example)[0] * ctx.num_replicas, tf.float32)
    reg = out.regularization_loss
    if reg is None:
        reg = tf1.losses.get_regularization_loss(scope=reg_scope)
    reg = tf.cast(reg, tf.float32)
    scaled = total / global_batch + reg / float(ctx.num_replicas)
    mean = tf.reduce_mean(per_example) + reg
    return scaled, mean


def make_optimizer(optimizer):
    """An optimizer instance from an instance or a zero-argument factory (called in the current graph)."""
    import tensorflow as tf
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        return optimizer
    if callable(optimizer):
        opt = optimizer()
        if isinstance(opt, tf.compat.v1.train.Optimizer):
            return opt
        raise ModelFnError(f"optimizer factory returned {type(opt).__name__}, not a tf.compat.v1.train.Optimizer")
    raise ModelFnError(f"optimizer must be a tf.compat.v1.train.Optimizer or a factory of one, "
                       f"got {type(optimizer).__name__}")


def compute_gradients(optimizer, scaled_loss, var_list=None, **kwargs):
    """``[(grad, var)]`` of ``scaled_loss`` for the trainable variables, without unused ones."""
    pairs = optimizer.compute_gradients(scaled_loss, var_list=var_list, **kwargs)
    pairs = [(g, v) for g, v in pairs if g is not None]
    if not pairs:
        raise ModelFnError("the loss depends on no trainable variable; nothing to train")
    return pairs
