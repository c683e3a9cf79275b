"""The strategy interface every way of replicating shares, and the loss scaling they all use.

A user writes ``model_fn(features, labels, mode) -> ModelOutput`` with a loss
*per example*. A :class:`Strategy` turns that into training: it lays the
variables out (``scope``), calls the model once per replica it hosts, scales
each replica's loss to the **global** batch (sum of per-example losses divided
by per-replica batch x replicas in sync; regularisation divided by replicas,
mission item 6), combines the gradients its own way, and returns a
:class:`TrainGraph`: the step to run, the ops that initialise and check the
model, and the hooks the session must call. Parameter servers (sync, async),
mirrored towers, central storage and collective all-reduce all fit this shape:
a tower strategy calls ``next_batch`` and ``model_fn`` once per device.
"""

import abc
import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import TfclusterError
from ..server import is_false_duplicate

log = logging.getLogger("tfcluster")


class Mode:
    """What ``model_fn`` is asked to build: ``Mode.TRAIN``, ``Mode.EVAL`` or ``Mode.PREDICT``."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "predict"


class ModelFnError(TfclusterError, ValueError):
    """``model_fn`` returned something tfcluster cannot train or evaluate."""


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
    per_example = tf.cast(out.per_example_loss, tf.float32)
    if per_example.shape.rank > 1:
        per_example = tf.reduce_sum(per_example, axis=list(range(1, per_example.shape.rank)))
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


def compute_gradients(optimizer, scaled_loss, var_list=None):
    """``[(grad, var)]`` of ``scaled_loss`` for the trainable variables, without unused ones."""
    pairs = optimizer.compute_gradients(scaled_loss, var_list=var_list)
    pairs = [(g, v) for g, v in pairs if g is not None]
    if not pairs:
        raise ModelFnError("the loss depends on no trainable variable; nothing to train")
    return pairs


# ------------------------------------------------------------------ stepping
def rerun_false_duplicates(fn, *args, attempts: int = 5, **kwargs):
    """``fn(*args, **kwargs)``, run again (up to ``attempts`` times) when TF rejects it as a false duplicate."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if attempt == attempts or not is_false_duplicate(e):
                raise
            log.warning("TF rejected a step as a duplicate request although it was sent once "
                        "(TF 2.21's 32-bit request ids, pitfalls item 15); running it again (attempt %d of %d)",
                        attempt + 1, attempts)


@dataclass
class StepResult:
    """One step as the loop sees it: the global step after it, this replica's loss, extras."""

    global_step: int
    loss: float = math.nan
    extra: Any = None


class StepRunner:
    """Runs one training step on a session; one ``session.run`` for the simple strategies.

    ``attach`` is called after each session (re)creation and builds the
    callables, so that a step costs one C++ call with no fetch parsing.
    """

    def __init__(self, train_fetch, loss):
        self.train_fetch = train_fetch  # a tensor: the global step after this step's update
        self.loss = loss
        self._run = self._run_extra = None
        self._extra = None

    def attach(self, session, extra=None):
        """Bind to ``session``; ``extra`` is fetched along when ``step(with_extra=True)``."""
        self._run = session.make_callable([self.train_fetch, self.loss])
        self._extra = extra
        self._run_extra = session.make_callable([self.train_fetch, self.loss, extra]) if extra is not None else None

    def step(self, with_extra: bool = False) -> StepResult:
        """Run one step; fetch the extra (a summary) along when asked."""
        # A step that TF falsely rejects ran nowhere but, with several ps, perhaps in
        # part on another ps: an async update is then applied partly twice, which
        # async training absorbs like any stale gradient.
        if with_extra and self._run_extra is not None:
            gs, loss, extra = rerun_false_duplicates(self._run_extra)
            return StepResult(int(gs), float(loss), extra)
        gs, loss = rerun_false_duplicates(self._run)
        return StepResult(int(gs), float(loss))


class Hook:
    """What a strategy asks of the session around it (all optional)."""

    def after_create_session(self, session, restored: bool):
        """Called after each session (re)creation, before the first step on it."""

    def end(self, session):
        """Called once when training ends normally."""


@dataclass
class TrainGraph:
    """A built training graph, as a strategy hands it to the session and the loop.

    - ``runner``: runs one step (see :class:`StepRunner`).
    - ``global_step``, ``loss`` (this worker's mean per-example loss).
    - ``local_init_ops``: run by every session after the model is ready
      (worker-local state). ``chief_local_init_ops``: run by the chief's
      sessions only, also after a restore (shared state kept out of checkpoints).
    - ``state_variables``: shared variables that are not part of the model
      (not checkpointed) but must be initialised before anyone trains.
    - ``hooks``: :class:`Hook` objects.
    """

    runner: StepRunner
    global_step: Any
    loss: Any
    local_init_ops: list = field(default_factory=list)
    chief_local_init_ops: list = field(default_factory=list)
    state_variables: list = field(default_factory=list)
    hooks: list = field(default_factory=list)
    model: Optional[ModelOutput] = None


# ------------------------------------------------------------------ strategy
class Strategy(abc.ABC):
    """How replicas are laid out and how their gradients become one update.

    Lifecycle: ``bind(cluster)`` once; then, in a fresh graph,
    ``input_context(batch)`` for the input function, the input pipeline under
    ``input_scope()``, and ``build(...)``, which enters ``scope()`` itself
    wherever it creates model variables.
    """

    #: Short name used in logs and in ``strategies.get``.
    name = "strategy"

    def __init__(self):
        self.cluster = None
        self.towers = None      # a mirrored.Towers when replicas run on several devices of each worker

    def bind(self, cluster) -> "Strategy":
        """Attach to ``cluster`` (None for a single process) and check that it fits; returns self."""
        self.cluster = cluster
        return self

    @property
    def task(self):
        """This process's task in the cluster, or None in a single process."""
        return None if self.cluster is None else self.cluster.task

    @property
    def is_chief(self) -> bool:
        """True for the process that initialises, checkpoints and writes summaries."""
        return self.cluster is None or self.cluster.is_chief

    @property
    @abc.abstractmethod
    def num_replicas_in_sync(self) -> int:
        """Replicas whose batches make one global batch (the loss divisor's multiplier)."""

    @property
    def num_workers(self) -> int:
        """Processes that train (each runs its own input pipeline)."""
        return 1 if self.cluster is None else self.cluster.num_replicas

    @property
    def worker_index(self) -> int:
        """This process's index among the training processes (chief first)."""
        if self.cluster is None:
            return 0
        return self.cluster.tasks(("chief", "worker")).index(self.cluster.task)

    @property
    def replicas_per_worker(self) -> int:
        """Replicas (towers) inside one training process."""
        return 1 if self.towers is None else self.towers.count

    def with_towers(self, devices) -> "Strategy":
        """Run one replica per local device inside each worker (see :mod:`.mirrored`); returns self.

        ``devices``: a number (GPUs if present, else virtual CPU devices) or a
        list of device names. The towers' gradients are summed in the worker
        before this strategy combines them across workers.
        """
        from .mirrored import Towers
        self.towers = Towers(devices)
        return self

    def configure(self, config):
        """Adjust this process's ConfigProto (server and session) for the strategy; returns it."""
        return config if self.towers is None else self.towers.configure(config)

    @property
    def should_init(self) -> bool:
        """True when this process initialises (or restores) its variables: the chief, unless each worker owns a copy."""
        return self.is_chief

    def input_context(self, per_replica_batch: Optional[int] = None) -> InputContext:
        """The InputContext this worker's input_fn gets."""
        return InputContext(self.num_workers, self.worker_index, per_replica_batch, self.num_replicas_in_sync)

    def replica_context(self, per_replica_batch: Optional[int] = None, tower: int = 0) -> ReplicaContext:
        """The ReplicaContext of local replica ``tower``."""
        return ReplicaContext(self.num_replicas_in_sync, self.worker_index * self.replicas_per_worker + tower,
                              per_replica_batch)

    @property
    def worker_device(self) -> Optional[str]:
        """Where this worker's own ops run (None: wherever the session puts them)."""
        return None if self.task is None else self.task.device

    def scope(self):
        """Device (and partitioner) scope in which the model's variables are created."""
        return contextlib.nullcontext()

    def input_scope(self):
        """Device scope for this worker's input pipeline and other worker-side ops."""
        if self.worker_device is None:
            return contextlib.nullcontext()
        import tensorflow as tf
        return tf.compat.v1.device(self.worker_device)

    def placement_devices(self) -> list:
        """Devices a placement report should list even when empty."""
        return []

    @abc.abstractmethod
    def build(self, model_fn: Callable, next_batch: Callable, optimizer, per_replica_batch=None) -> TrainGraph:
        """Build the training graph; ``next_batch()`` gives one replica's (features, labels)."""

    def describe(self) -> str:
        """One line for logs."""
        return self.name


def build_single_replica(strategy: Strategy, model_fn, next_batch, optimizer, per_replica_batch):
    """The part every one-replica-per-worker strategy shares.

    Returns ``(global_step, optimizer, model_output, mean_loss, grads_and_vars, update_ops)``;
    ``update_ops`` (batch-norm statistics and the like) must run with the train op. With
    ``strategy.towers`` the replica is one per local device, their gradients summed.
    """
    if strategy.towers is not None:
        return strategy.towers.build(strategy, model_fn, next_batch, optimizer, per_replica_batch).as_tuple()
    import tensorflow as tf
    tf1 = tf.compat.v1
    global_step = tf1.train.get_or_create_global_step()
    features, labels = next_batch()
    out = call_model_fn(model_fn, features, labels, Mode.TRAIN)
    scaled, mean = replica_loss(out, strategy.replica_context(per_replica_batch))
    opt = make_optimizer(optimizer)
    update_ops = list(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS))
    grads = compute_gradients(opt, scaled)
    return global_step, opt, out, mean, grads, update_ops


def global_step_after(ops, global_step):
    """The global step read after ``ops`` ran: what a step runner fetches."""
    import tensorflow as tf
    with tf.control_dependencies(list(ops)):
        return tf.identity(global_step.read_value())


class LocalStrategy(Strategy):
    """One process, one replica, no cluster: the reference every other strategy must match."""

    name = "local"

    def bind(self, cluster) -> "Strategy":
        """A local strategy ignores any cluster: it always trains alone."""
        self.cluster = None
        return self

    @property
    def num_replicas_in_sync(self) -> int:
        """One replica."""
        return 1

    def build(self, model_fn, next_batch, optimizer, per_replica_batch=None) -> TrainGraph:
        """Plain ``apply_gradients`` on the scaled loss."""
        with self.scope():
            return self._build(model_fn, next_batch, optimizer, per_replica_batch)

    def _build(self, model_fn, next_batch, optimizer, per_replica_batch):
        gs, opt, out, mean, grads, update_ops = build_single_replica(self, model_fn, next_batch, optimizer,
                                                                     per_replica_batch)
        train = opt.apply_gradients(grads, global_step=gs)
        return TrainGraph(StepRunner(global_step_after([train] + update_ops, gs), mean), gs, mean, model=out)
