"""Graph-mode ``fit`` / ``evaluate`` / ``predict`` over a model function, and the evaluator task.

The contract::

    def model_fn(features, labels, mode) -> tfcluster.ModelOutput:
        logits = ...
        return ModelOutput(predictions=tf.argmax(logits, 1),
                           per_example_loss=tf.nn.sparse_softmax_cross_entropy_with_logits(...),
                           metrics={"accuracy": tf.compat.v1.metrics.accuracy(labels, ...)})

    def input_fn(ctx: tfcluster.InputContext) -> tf.data.Dataset:
        return ctx.shard(dataset).batch(ctx.per_replica_batch)

``fit`` reads the cluster from TF_CONFIG (or trains alone without one), plays
this task's role (ps tasks serve, the evaluator evaluates, workers train),
scales the loss to the global batch, logs progress, writes summaries and
checkpoints in ``checkpoint_dir``, and tells the ps tasks when it is done.
Checkpoints are written by the chief, with no device inside them that a
single process could not restore (pitfalls item 9).
"""

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .. import strategies
from ..core.checks import seconds, whole_number
from ..core.errors import SpecError
from ..data.pipeline import without_autotune_thread
from ..graph.model import make_dataset, split_element
from ..graph.placement import human_bytes, placement_report, record_ps_state
from ..runtime.shutdown import done_when_finished
from ..topology.cluster import Cluster, Role
from .assembly import RunAssembly, part_of
from .checkpoint_watch import EVALUATOR_TIMEOUT_SECS
from .evaluation import local_config, run_evaluator
from .hooks import ProgressHook, SummaryHook, TimelineHook
from .input_position import input_position
from .liveness import CHIEF_TIMEOUT_SECS
from .loop import run_loop
from .session import MAX_RECOVERIES, STARTUP_TIMEOUT_SECS, STEP_TIMEOUT_SECS
from .train_metrics import SharedMetrics, TrainMetricsHook, examples_in, steps_for_epochs

log = logging.getLogger("tfcluster")


@dataclass
class FitResult:
    """What ``fit`` did on this process."""

    task: str
    global_step: int
    local_steps: int = 0
    loss: float = math.nan
    seconds: float = 0.0
    steps_per_sec: float = 0.0
    examples_per_sec: float = 0.0
    checkpoint: Optional[str] = None
    first_step_at: Optional[float] = None
    evaluations: list = field(default_factory=list)
    last_step_at: Optional[float] = None
    #: ``(epoch seconds, local steps)`` about every half second, so throughput
    #: can be measured over the window in which all workers ran.
    timeline: list = field(default_factory=list)


@dataclass(frozen=True)
class FitConfig:
    """``fit``'s options beyond the model, the data and the target; each can be passed to ``fit`` by name.

    - ``save_checkpoint_steps`` / ``save_checkpoint_secs``: how often the chief
      saves (either may be None); ``keep_checkpoints``: how many it keeps.
    - ``save_incremental_checkpoint_steps`` / ``_secs``: between those, how often the chief saves the rows
      of embedding variables written since its last save (DeepRec's incremental checkpoints; None: never).
    - ``summary_steps``: TensorBoard summaries every N steps (None: none).
    - ``log_every_secs``: a progress line per worker this often.
    - ``evaluator_timeout_secs``: the evaluator gives up after this long without a new checkpoint.
    - ``startup_timeout``: seconds to wait for the ps tasks and the chief.
    - ``max_recoveries``: lost sessions recreated before giving up.
    - ``step_timeout_secs``: a step waiting longer on a ps that stopped answering (a hung host, a
      partition) is given up, the silent task named, and the session recovered.
    - ``chief_timeout_secs``: workers that have not heard from the chief for this long stop, in one line.
    - ``seed``: the graph's random seed; ``log_placement``: print each variable's device.
    """

    save_checkpoint_steps: Optional[int] = None
    save_checkpoint_secs: Optional[float] = 60.0
    save_incremental_checkpoint_steps: Optional[int] = None
    save_incremental_checkpoint_secs: Optional[float] = None
    summary_steps: Optional[int] = 100
    log_every_secs: float = 5.0
    keep_checkpoints: int = 5
    evaluator_timeout_secs: float = EVALUATOR_TIMEOUT_SECS
    startup_timeout: float = STARTUP_TIMEOUT_SECS
    max_recoveries: int = MAX_RECOVERIES
    step_timeout_secs: float = STEP_TIMEOUT_SECS
    chief_timeout_secs: float = CHIEF_TIMEOUT_SECS
    seed: Optional[int] = None
    log_placement: bool = False

    def __post_init__(self):
        for name in ("save_checkpoint_steps", "save_incremental_checkpoint_steps", "summary_steps", "keep_checkpoints",
                     "max_recoveries"):
            whole_number(name, getattr(self, name), optional=True)
        for name in ("save_checkpoint_secs", "save_incremental_checkpoint_secs", "evaluator_timeout_secs",
                     "startup_timeout", "step_timeout_secs", "chief_timeout_secs"):
            seconds(name, getattr(self, name), optional=True)
        seconds("log_every_secs", self.log_every_secs, positive=False)  # 0: a line after every step

    def bounds(self) -> dict:
        """The session's bounds, as :class:`~.assembly.RunAssembly` takes them."""
        return {"startup_timeout": self.startup_timeout, "max_recoveries": self.max_recoveries,
                "step_timeout_secs": self.step_timeout_secs, "chief_timeout_secs": self.chief_timeout_secs}

    def replace(self, **options) -> "FitConfig":
        """This config with ``options`` changed; an unknown name is refused, naming every known one."""
        known = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise SpecError(f"fit() has no option {', '.join(map(repr, unknown))}; its options: "
                            f"{', '.join(known)}")
        return dataclasses.replace(self, **options)


# ------------------------------------------------------------------ helpers
def resolve_cluster(cluster=None):
    """The cluster to train on: the one given, else TF_CONFIG's, else None (a single process)."""
    return cluster if cluster is not None else Cluster.from_environment()


def _evaluate(cluster, model_fn, eval_input_fn, checkpoint_dir, batch_size, config) -> FitResult:
    """The evaluator's part: evaluate each new checkpoint until the chief's last."""
    if eval_input_fn is None:
        raise SpecError("this task is the evaluator, but fit() got no eval_input_fn")
    evals = run_evaluator(model_fn, eval_input_fn, checkpoint_dir, timeout_secs=config.evaluator_timeout_secs,
                          batch_size=batch_size)
    last = evals[-1] if evals else {}
    return FitResult(str(cluster.task), int(last.get("global_step") or 0), evaluations=evals)


# ---------------------------------------------------------------------- fit
def fit(model_fn: Callable, input_fn: Callable, *, optimizer, steps: Optional[int] = None, epochs=None,
        strategy=None, batch_size: Optional[int] = None, checkpoint_dir: Optional[str] = None,
        eval_input_fn: Optional[Callable] = None, cluster=None, hooks=(), config: Optional[FitConfig] = None,
        examples_per_epoch: Optional[int] = None, **options) -> Optional[FitResult]:
    """Train ``model_fn`` on ``input_fn``'s data until the global step reaches ``steps`` (or ``epochs`` passes).

    Plays this process's role: a ps task serves until every trainer is done
    (returns None); the evaluator runs :func:`run_evaluator` on
    ``eval_input_fn``; chief and workers train. ``strategy`` is a
    :class:`~tfcluster.strategies.Strategy` or a registered name (``"sync"``,
    ``"async"``, ``"local"``...; default: :func:`tfcluster.strategies.default_name`).
    ``batch_size`` is the per-replica batch that ``input_fn`` should produce
    (``ctx.per_replica_batch``); the loss is divided by it x replicas in sync.
    The input is repeated as needed. ``epochs`` instead of ``steps``: passes
    over the data, whose size is read from ``input_fn`` (or given as
    ``examples_per_epoch``); model_fn's ``metrics`` are then reported at each
    epoch's end (:mod:`tfcluster.training.train_metrics`). ``hooks``: more
    :class:`~tfcluster.training.hooks.Hook` (or TF ``SessionRunHook``) objects for the
    loop. ``config`` and ``**options``: :class:`FitConfig`.
    """
    config = (config or FitConfig()).replace(**options)
    if (steps is None) == (epochs is None):
        raise SpecError("give fit() steps or epochs, one of them")
    whole_number("steps", steps, optional=True)
    whole_number("epochs", epochs, optional=True)
    if epochs is not None and not batch_size:
        raise SpecError("epochs needs batch_size (the examples of a step come from it)")
    cluster = resolve_cluster(cluster)
    if cluster is not None and cluster.task is None:
        raise SpecError("the cluster names no task for this process; set TF_CONFIG's 'task'")
    role = part_of(cluster, "fit")
    if role is Role.PS:
        return None
    if role is Role.EVALUATOR:
        return _evaluate(cluster, model_fn, eval_input_fn, checkpoint_dir, batch_size, config)
    strategy = strategies.get(strategy or strategies.default_name(cluster)).bind(cluster)
    if cluster is not None and strategy.cluster is None and cluster.num_replicas > 1:
        log.warning("%s trains a private copy of the model: the %s strategy ignores the cluster's other "
                    "trainers (use async, sync or collective)", cluster.task, strategy.name)
    run = _FitRun(strategy, checkpoint_dir, batch_size, config)
    if epochs is not None:
        examples = examples_per_epoch or examples_in(input_fn)
        run.steps_per_epoch = steps_for_epochs(1, examples, strategy.examples_per_step(batch_size))
        run.epochs, steps = epochs, epochs * run.steps_per_epoch
        log.info("%s: %d epoch(s) of %d examples: %d global steps of %d examples each", run.name, epochs, examples,
                 steps, strategy.examples_per_step(batch_size))
    run.build(model_fn, input_fn, optimizer, hooks)
    with done_when_finished(run.cluster):
        return run.train(steps)


class _FitRun:
    """One process's part of ``fit``: its server, its graph and session, its loop."""

    def __init__(self, strategy, checkpoint_dir, batch_size, config: FitConfig):
        self.strategy, self.batch_size, self.config = strategy, batch_size, config
        self.cluster = strategy.cluster          # None for a local strategy, whatever TF_CONFIG says
        # A strategy whose workers each own a copy (collective) initialises on every worker.
        self.run = RunAssembly(self.cluster, should_init=strategy.should_init, checkpoint_dir=checkpoint_dir,
                               **config.bounds())
        self.name, self.is_chief, self.checkpoint_dir = self.run.name, self.run.is_chief, self.run.checkpoint_dir
        self.started = time.monotonic()
        self.steps_per_epoch = self.epochs = None
        if self.cluster is not None:
            # The strategy may need more of the server (virtual devices for towers, a collective group leader).
            self.run.serve(strategy.configure(self.cluster.session_config()))
        self.run.prepare()

    def build(self, model_fn, input_fn, optimizer, user_hooks):
        """The graph, the session with its hooks, finalized."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        s, config = self.strategy, self.config
        self.graph = tf1.Graph()
        with self.graph.as_default():
            if config.seed is not None:
                tf1.set_random_seed(config.seed)
            with s.input_scope():
                ds = make_dataset(input_fn, s.input_context(self.batch_size))
                self.iterator = iterator = tf1.data.make_initializable_iterator(
                    without_autotune_thread(ds.repeat().prefetch(tf.data.experimental.AUTOTUNE)))

            def next_batch():
                with s.input_scope():
                    return split_element(iterator.get_next())
            train_graph = s.build(model_fn, next_batch, optimizer, self.batch_size)
            self.metrics = SharedMetrics(train_graph)
            with s.input_scope():
                saver = self.run.saver(max_to_keep=config.keep_checkpoints) if self.run.saves else None
                summary_op = None
                if self.run.saves and config.summary_steps:
                    tf1.summary.scalar("loss", train_graph.loss)
                    summary_op = tf1.summary.merge_all()
            self.report = placement_report(self.graph, devices=s.placement_devices())
            session_config = s.configure(self.cluster.session_config() if self.cluster is not None
                                         else local_config())
            self.session = self.run.session(train_graph, config=session_config, saver=saver,
                                            extra_local_init=[iterator.initializer])
            self.writer = tf1.summary.FileWriter(self.checkpoint_dir) if self.run.saves else None
            self.session.finalize(self._hooks(train_graph, saver, summary_op) + list(user_hooks))

    def _hooks(self, train_graph, saver, summary_op) -> list:
        """The loop's own features, as hooks: metrics, timeline, progress, input position; the run's standard ones."""
        # Examples per step of this process: one batch per replica it hosts (towers).
        examples = (self.batch_size or 0) * self.strategy.replicas_per_worker
        self.progress = ProgressHook(self.name, self.config.log_every_secs, examples, self.started, self.writer)
        self.timeline = TimelineHook()
        c = self.config
        own = [TrainMetricsHook(self.metrics, self.name, c.log_every_secs, self.is_chief, self.writer,
                                self.steps_per_epoch, self.epochs)] if self.metrics else []
        own += [self.timeline, self.progress]
        own += input_position(self.iterator, self.checkpoint_dir, train_graph.global_step, self.name,
                              save_steps=c.save_checkpoint_steps, save_secs=c.save_checkpoint_secs,
                              keep=(c.keep_checkpoints or 3) + 2)
        summary = SummaryHook(self.writer, summary_op, c.summary_steps) if summary_op is not None else None
        return self.run.hooks(train_graph, self.session, saver=saver, save_steps=c.save_checkpoint_steps,
                              save_secs=c.save_checkpoint_secs, own=own, summary=summary,
                              increment_steps=c.save_incremental_checkpoint_steps,
                              increment_secs=c.save_incremental_checkpoint_secs)

    def _log_start(self):
        s = self.strategy
        log.info("%s trains with %s, %d replica(s) in sync, per-replica batch %s", self.name, s.describe(),
                 s.num_replicas_in_sync, self.batch_size if self.batch_size is not None else "(from input_fn)")
        if s.placement_devices():
            totals = ", ".join(f"{d} {human_bytes(b)}" for d, b in self.report.totals().items())
            log.info("placement: %s (imbalance %.1f%%)", totals, 100 * self.report.imbalance())
        if self.config.log_placement:
            log.info("%s", self.report.format())
        record_ps_state(self.report.totals())

    def train(self, steps: int) -> FitResult:
        """Create the session, run the loop to ``steps``, close; this process's FitResult."""
        if self.is_chief:
            self._log_start()
        with self.graph.as_default():
            try:
                self.session.create()
                if self.run.checkpoints is not None:
                    self.run.checkpoints.checkpoint = self.session.restored_from
                gs = run_loop(self.session, last_step=steps, name=self.name)
            finally:
                if self.writer is not None:
                    self.writer.close()
                self.session.close()
        p = self.progress
        p.report(gs)
        return FitResult(self.name, gs, p.steps, p.loss, p.seconds, p.steps_per_sec, p.steps_per_sec * p.batch,
                         self.run.checkpoints.checkpoint if self.run.checkpoints is not None
                         else self.session.restored_from,
                         p.first_step_at, last_step_at=p.last_step_at, timeline=self.timeline.marks)
