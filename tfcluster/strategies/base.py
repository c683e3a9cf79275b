"""The interface every way of replicating shares: a Strategy builds a TrainGraph, a StepRunner steps it.

A :class:`Strategy` turns the model contract (:mod:`tfcluster.graph.model`) into
training: it lays the variables out (``scope``), calls ``model_fn`` once per
replica it hosts, scales each replica's loss to the global batch, combines the
gradients its own way, and returns a :class:`TrainGraph`: the step to run, the
ops that initialise and check the model, and the hooks the session must call.
Parameter servers (sync, async), mirrored towers, central storage and
collective all-reduce all fit this shape; any of them can run several towers
inside each worker (``towers=``, :mod:`.towers`).
"""

import abc
import contextlib
from typing import Callable, Optional

from ..graph.model import (InputContext, Mode, ReplicaContext, call_model_fn, compute_gradients, make_optimizer,
                           metric_updates, replica_loss)
from ..graph.step import TrainGraph
from .towers import Towers


class Strategy(abc.ABC):
    """How replicas are laid out and how their gradients become one update.

    Lifecycle: ``bind(cluster)`` once; then, in a fresh graph,
    ``input_context(batch)`` for the input function, the input pipeline under
    ``input_scope()``, and ``build(...)``, which enters ``scope()`` itself
    wherever it creates model variables. ``towers``: replicas inside each
    worker, one per local device (None: one replica on the worker's CPU;
    see :class:`~.towers.Towers`).
    """

    #: Short name used in logs.
    name = "strategy"
    #: How this strategy's towers hold the variables (see :class:`~.towers.Towers`).
    tower_storage = "shared"

    def __init__(self, towers=None):
        self.cluster = None
        self.towers = None if towers is None else Towers(towers, storage=self.tower_storage)

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
        return self.cluster.trainers().index(self.cluster.task)

    @property
    def replicas_per_worker(self) -> int:
        """Replicas (towers) inside one training process."""
        return 1 if self.towers is None else self.towers.count

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

    def examples_per_step(self, per_replica_batch: int) -> int:
        """Examples one global step consumes: the global batch (an epoch is data size / this)."""
        return per_replica_batch * self.num_replicas_in_sync

    @abc.abstractmethod
    def build(self, model_fn: Callable, next_batch: Callable, optimizer, per_replica_batch=None) -> TrainGraph:
        """Build the training graph; ``next_batch()`` gives one replica's (features, labels)."""

    def describe(self) -> str:
        """One line for logs."""
        return self.name

    @property
    def trains_embedding_variables(self) -> bool:
        """Whether this strategy trains embedding variables (tfcluster.embedding): one process, and async ps."""
        return False


def refuse_embedding_variables(strategy: Strategy):
    """One line when the model made embedding variables and ``strategy`` cannot train them."""
    from ..core.errors import SpecError
    from ..embedding import embedding_variables
    if embedding_variables() and not strategy.trains_embedding_variables:
        names = ", ".join(v.name for v in embedding_variables())
        raise SpecError(f"embedding variables ({names}) train in one process or under the async ps strategy; "
                        f"{strategy.describe()} cannot train them yet (docs/embeddings.md)")


def build_single_replica(strategy: Strategy, model_fn, next_batch, optimizer, per_replica_batch):
    """The part every one-replica-per-worker strategy shares.

    Returns ``(global_step, optimizer, model_output, mean_loss, grads_and_vars, update_ops)``;
    ``update_ops`` (batch-norm statistics and the like) must run with the train op. With
    ``strategy.towers`` the replica is one per local device, their gradients summed.
    """
    if strategy.towers is not None:
        built = strategy.towers.build(strategy, model_fn, next_batch, optimizer, per_replica_batch).as_tuple()
        refuse_embedding_variables(strategy)
        return built
    import tensorflow as tf
    tf1 = tf.compat.v1
    global_step = tf1.train.get_or_create_global_step()
    features, labels = next_batch()
    out = call_model_fn(model_fn, features, labels, Mode.TRAIN)
    refuse_embedding_variables(strategy)
    scaled, mean = replica_loss(out, strategy.replica_context(per_replica_batch))
    opt = make_optimizer(optimizer)
    update_ops = list(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)) + metric_updates(out)
    grads = compute_gradients(opt, scaled)
    return global_step, opt, out, mean, grads, update_ops
