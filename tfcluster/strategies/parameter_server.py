"""Between-graph replication over parameter servers: asynchronous and synchronous.

Every worker builds the same graph; the variables live on the ps tasks, placed
by bytes (:mod:`tfcluster.graph.placement`). Each worker's loss is scaled to the
global batch (per-worker batch x replicas in sync), so that gradients *add up*
to the gradient of the global batch's mean loss.

**async**: each worker applies its own gradients as soon as it has them. With
the loss scaled to the global batch of N workers, one async update is 1/N of a
full global-batch step, and one round of N updates (one per worker) moves the
weights about as far as one sync step with the same learning rate. That is the
choice here: the same learning rate means the same progress per example in
both modes. ``steps`` counts updates (the global step), so an async run of
``steps`` processes ``steps x batch`` examples in all, N times fewer than a
sync run of the same ``steps``.

**sync**: one update per global step, from the gradients of at least
``replicas_to_aggregate`` distinct workers; the others are backups. How a step
is gathered, applied and bounded is :mod:`.sync`.

**wire** (``"bfloat16"``, ``"float16"``; default ``TFCLUSTER_WIRE``, else
float32): weights and gradients cross between ps and workers in 16 bits while
the ps keeps and updates float32 (:mod:`tfcluster.graph.wire`).
"""

import contextlib
from typing import Optional

from ..core.checks import whole_number
from ..core.errors import SpecError
from ..graph import prefetch
from ..graph.prefetch import wanted as prefetch_wanted
from ..graph.placement import MAX_SHARD_BYTES, ByteBalancedSetter, check_max_shard_bytes, spread_over_ps
from ..graph.sparse import install as install_distinct_lookups
from ..graph.step import StepRunner, TrainGraph, global_step_after
from ..graph.wire import Wire, resolve_wire
from .base import Strategy, build_single_replica
from .sync import SyncGraph
from .sync_run import SyncRunner, stall_defaults

MODES = ("async", "sync")


class ParameterServerStrategy(Strategy):
    """Data parallelism over ps tasks, ``mode="async"`` or ``mode="sync"``.

    ``replicas_to_aggregate`` (sync only, default: every worker) is R; the
    other workers are backups (``backups=B`` says the same as R = workers - B,
    for when the number of workers is not known yet). ``partition_min_bytes`` splits variables at
    least that big across the ps tasks (default: 256 KB when the ps run on 2 or more machines, so no big
    kernel makes one ps's network the busiest; 0 turns it off). ``max_shard_bytes`` (8 MB; None
    turns it off) splits any bigger variable into parts no bigger, which a
    worker pulls several times faster than one big tensor; the checkpoint
    still holds each variable whole. ``stall_warn_secs`` and
    ``stall_timeout_secs`` bound sync waits (a training step must take less
    than ``stall_warn_secs``). ``towers``: replicas inside each worker.
    ``wire``: the type weights and gradients travel in (see the module doc). ``prefetch`` (async; default
    ``TFCLUSTER_PREFETCH``, else on): each step reads the next batch's rows from the ps while it trains on this
    one (:mod:`tfcluster.graph.prefetch`).
    """

    def __init__(self, mode: str = "async", replicas_to_aggregate: Optional[int] = None,
                 partition_min_bytes: Optional[int] = None, max_shard_bytes: Optional[int] = MAX_SHARD_BYTES,
                 stall_warn_secs: Optional[float] = None, stall_timeout_secs: Optional[float] = None,
                 backups: Optional[int] = None, towers=None, wire: Optional[str] = None,
                 prefetch: Optional[bool] = None):
        super().__init__(towers)
        self.wire = Wire(resolve_wire(wire), receiver=None)
        if mode not in MODES:
            raise SpecError(f"parameter-server mode must be one of {', '.join(MODES)}, got {mode!r}")
        for what, value in (("replicas_to_aggregate", replicas_to_aggregate), ("backups", backups)):
            if value is not None and mode != "sync":
                raise SpecError(f"{what} applies to mode='sync' only")
        if replicas_to_aggregate is not None and backups is not None:
            raise SpecError("give replicas_to_aggregate or backups, not both (backups = workers - "
                            "replicas_to_aggregate)")
        if prefetch and mode != "async":
            raise SpecError("prefetch applies to mode='async' only: a sync step's rows are of the step's weights")
        self.prefetch = mode == "async" and prefetch_wanted(prefetch)
        self.backups = whole_number("backups", backups, optional=True)
        self.mode = mode
        self._replicas_to_aggregate = replicas_to_aggregate
        check_max_shard_bytes(max_shard_bytes)
        self.partition_min_bytes = partition_min_bytes
        self.max_shard_bytes = max_shard_bytes
        self.stall_warn_secs, self.stall_timeout_secs = stall_defaults(stall_warn_secs, stall_timeout_secs)
        self.setter = None
        self.name = f"ps-{mode}"

    # ------------------------------------------------------------- binding
    def bind(self, cluster) -> "ParameterServerStrategy":
        """Check that ``cluster`` has ps tasks and that this task trains."""
        if cluster is None or not cluster.num_tasks("ps"):
            raise SpecError(f"the {self.name} strategy needs a cluster with ps tasks "
                            "(TF_CONFIG, or tfcluster local --ps 1 --workers 2)")
        if cluster.task is None or not cluster.task.trains:
            raise SpecError(f"the {self.name} strategy runs on chief and worker tasks, not on {cluster.task}")
        n = cluster.num_replicas
        if self.backups is not None:
            if self.backups >= n:
                raise SpecError(f"backups={self.backups} leaves no worker to aggregate among the {n} training "
                                "task(s)")
            self._replicas_to_aggregate = n - self.backups
        r = self._replicas_to_aggregate
        if r is not None and not 1 <= r <= n:
            raise SpecError(f"replicas_to_aggregate={r} must be between 1 and the {n} training task(s)")
        self.cluster = cluster
        return self

    @property
    def replicas_to_aggregate(self) -> int:
        """R: distinct workers whose gradients make one sync step (all workers in async)."""
        return self._replicas_to_aggregate or self.num_workers

    @property
    def num_replicas_in_sync(self) -> int:
        """R in sync mode; every worker in async mode (see the module docstring); times the towers per worker."""
        workers = self.replicas_to_aggregate if self.mode == "sync" else self.num_workers
        return workers * self.replicas_per_worker

    def examples_per_step(self, per_replica_batch: int) -> int:
        """Sync: the global batch; async: one worker's batch (each update is one worker's step)."""
        if self.mode == "sync":
            return super().examples_per_step(per_replica_batch)
        return per_replica_batch * self.replicas_per_worker

    def placement_devices(self) -> list:
        """Every ps task, so that an empty one shows in the report."""
        return [t.device for t in self.cluster.tasks(("ps",))]

    @contextlib.contextmanager
    def scope(self):
        """Variables go to the ps tasks by bytes (big ones in parts); other ops to this worker."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        self.setter = ByteBalancedSetter.for_cluster(self.cluster)
        install_distinct_lookups()      # a lookup reads each distinct row once from the ps (graph/sparse.py)
        # The worker's CPU receives the weights and sends the gradients (its towers read from there).
        self.wire = Wire(self.wire.dtype, receiver=self.worker_device + "/device:CPU:0")
        with contextlib.ExitStack() as stack:
            stack.enter_context(tf1.device(self.setter))
            # Each weight's read crosses to this worker (packed per ps, graph/crossing.py), in 16 bits on a wire.
            stack.enter_context(tf1.variable_creator_scope(self.wire.creator()))
            stack.enter_context(spread_over_ps(self.cluster, self.partition_min_bytes, self.max_shard_bytes))
            yield

    @property
    def trains_embedding_variables(self) -> bool:
        """Async only: a sync step aggregates variables' gradients, and embedding rows are not variables yet."""
        return self.mode == "async" and self.towers is None

    def describe(self) -> str:
        """e.g. ``ps-sync: 2 of 2 workers per step, 1 ps``."""
        ps = self.cluster.num_tasks("ps") if self.cluster else 0
        towers = f", {self.towers.describe()} per worker" if self.towers is not None else ""
        if self.wire.on:
            towers += f", {self.wire.dtype} wire"
        if self.mode == "sync":
            return (f"{self.name}: {self.replicas_to_aggregate} of {self.num_workers} workers per step, "
                    f"{ps} ps{towers}")
        return f"{self.name}: {self.num_workers} workers, {ps} ps{towers}"

    # ------------------------------------------------------------- building
    def build(self, model_fn, next_batch, optimizer, per_replica_batch=None) -> TrainGraph:
        """Build this worker's graph: the model on the ps, the update async or sync."""
        with self.scope():
            gs, opt, out, mean, grads, update_ops = build_single_replica(
                self, model_fn, next_batch, optimizer, per_replica_batch)
            grads = self.wire.gradients(grads)
            self.wire.report(str(self.task))
            if self.mode == "async":
                train = opt.apply_gradients(grads, global_step=gs)
                staging = prefetch.stage(gs.graph, str(self.task)) if self.prefetch else None
                puts = staging.attach(train) if staging else []
                fetch = global_step_after([train] + update_ops + puts, gs)
                return TrainGraph(StepRunner(fetch, mean), gs, mean, model=out, staging=staging)
        graph = SyncGraph(self.cluster.trainers(), self.worker_index, self.replicas_to_aggregate, gs, grads,
                          lambda aggregated: opt.apply_gradients(aggregated, global_step=gs), self.task.device,
                          loss=mean, update_ops=update_ops)
        runner = SyncRunner(graph, self.stall_warn_secs, self.stall_timeout_secs)
        chief_init = graph.chief_init_ops() if self.is_chief else []
        return TrainGraph(runner, gs, mean, local_init_ops=[graph.local_step_init], chief_local_init_ops=chief_init,
                          state_variables=graph.state_variables, model=out)
