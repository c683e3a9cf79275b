"""Training an Estimator's ``model_fn`` on tfcluster's cluster, session, placement and loop.

The ``model_fn`` builds its own ``train_op``; tfcluster supplies the rest of
what TF 1.x's Estimator took from ``replica_device_setter`` and
``MonitoredTrainingSession``, with tfcluster's fixes: variables go to the ps
tasks by bytes, a big table in one part per ps (:mod:`tfcluster.graph.placement`), every session sees only the ps
tasks and itself, a non-chief starts within a second of the chief instead of
waiting TF's 30 s (or the Estimator's extra (task_id + 1) x 5 s), a lost ps
or worker is recovered a bounded number of times, and false duplicate
aborts are rerun (by the training session, for every run of the process).
The chief checkpoints and writes summaries in ``model_dir``.
"""

import contextlib
import functools
import logging
import math
import time

import tensorflow as tf

from ..core.errors import ModelFnError, TfclusterError
from ..core.tferrors import cause, hint
from ..graph import prefetch
from ..graph.placement import ByteBalancedSetter, placement_report, record_ps_state, spread_over_ps
from ..graph.step import Hook, StepRunner, TrainGraph, global_step_after
from ..graph.wire import Wire
from ..runtime.checkpoints import checkpoint_step
from ..strategies.sync_replicas import FINISH_COLLECTION
from ..strategies.sync_run import FinishingRunner
from ..training.assembly import RunAssembly
from ..training.hooks import CheckpointHook, SummaryHook
from ..training.input_position import input_position
from ..training.loop import run_loop
from ..training.timer import Every
from .calls import call_input_fn, call_estimator_model_fn
from .replicas import build_collective, build_replicas, collective_of, input_context, towers_of
from .spec import ModeKeys
from .warm_start import apply as apply_warm_start

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")


class StepLogHook(Hook):
    """TF 1.x Estimator's lines: ``loss = ..., step = ...`` every N steps, and global steps per second."""

    def __init__(self, name: str, every_steps: int, writer=None):
        self.name, self.writer = name, writer
        self.local_steps = 0
        self.last_gs = None
        self._every = Every(steps=every_steps)
        self._every.mark(0)

    def after_run(self, run_context, run_values):
        """Count the step; every N steps, one line with the loss and the pace."""
        self.local_steps += 1
        self.last_gs = run_values.global_step
        if run_values.loss != run_values.loss:
            raise tf1.train.NanLossDuringTrainingError()
        if self._every.due(self.local_steps):
            seconds = max(time.monotonic() - self._every.last_time, 1e-9)
            rate = (self.local_steps - self._every.last_step) / seconds
            log.info("%s loss = %g, step = %d (%.1f local steps/s)", self.name, run_values.loss,
                     run_values.global_step, rate)
            self._every.mark(self.local_steps)

    def end(self, session):
        """One closing line: the steps this task ran, and the global step it ended at."""
        if self.last_gs is not None:
            log.info("%s done: global step %d, %d local step(s)", self.name, self.last_gs, self.local_steps)


class ListeningCheckpointHook(CheckpointHook):
    """The chief's checkpoints, calling TF 1.x ``CheckpointSaverListener``s around each save."""

    def __init__(self, *args, listeners=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.listeners = list(listeners)

    def begin(self):
        """The listeners' ``begin`` too."""
        super().begin()
        for listener in self.listeners:
            listener.begin()

    def save(self, step: int, final: bool = False):
        """``before_save``, the save, ``after_save`` (not after a save that failed)."""
        session = None
        for listener in self.listeners:
            session = session or self._session_now()
            listener.before_save(session, step)
        path = super().save(step, final)
        for listener in self.listeners if path is not None else ():
            listener.after_save(session or self._session_now(), step)
        return path

    def _session_now(self):
        return self._call(lambda s: s)

    def end(self, session):
        """The final save, then the listeners' ``end``."""
        super().end(session)
        for listener in self.listeners:
            listener.end(session, self._step)


class GlobalStepGuard(Hook):
    """Stop, in one line, a train_op that never moves the global step (training would never end)."""

    def __init__(self, patience: int = 20):
        self.patience = patience
        self._first = None
        self._seen = 0

    def after_run(self, run_context, run_values):
        """After ``patience`` steps the global step must have moved."""
        if self._first is None:
            self._first = run_values.global_step
        self._seen += 1
        if self._seen == self.patience and run_values.global_step == self._first:
            raise ModelFnError("model_fn's train_op does not increase the global step, so training would never "
                               "end; build it with optimizer.minimize(loss, global_step="
                               "tf.compat.v1.train.get_global_step())")


def _session_config(config, cluster, towers=None):
    """The user's ConfigProto, with the cluster's device filters and soft placement when it sets neither."""
    base = cluster.session_config() if cluster is not None else tf1.ConfigProto(allow_soft_placement=True)
    if towers is not None:
        towers.configure(base)      # N virtual CPU devices for N replicas without GPUs
    if config.session_config is None:
        return base
    mine = tf1.ConfigProto()
    mine.CopyFrom(config.session_config)
    if not mine.device_filters:
        mine.device_filters.extend(base.device_filters)
    mine.allow_soft_placement = True
    for kind, count in base.device_count.items():
        mine.device_count[kind] = max(count, mine.device_count.get(kind, 1))
    return mine


def train_on(estimator, input_fn, hooks, steps, max_steps, saving_listeners) -> int:
    """Train ``estimator`` as this task's role asks; returns the final global step."""
    config = estimator.config
    cluster = config.cluster
    if cluster is not None and not cluster.this_task().trains:
        raise TfclusterError(f"Estimator.train runs on the chief and the workers, not on {cluster.task}; "
                             "use tf.estimator.train_and_evaluate, which gives every task its role")
    collective = collective_of(config)
    towers = towers_of(config)          # several replicas in each training process, or None
    # With all-reduce every worker initialises its own copy (then takes worker 0's); only the chief saves.
    run = RunAssembly(cluster, name=None if cluster is not None else "estimator", checkpoint_dir=estimator.model_dir,
                      should_init=collective.should_init if collective is not None else None,
                      startup_timeout=config.session_creation_timeout_secs)
    if cluster is not None:
        # The collective group's leader must be in the server's own config (strategies/collective.py).
        server_config = None
        if collective is not None:
            server_config = collective.configure(cluster.session_config())
        if towers is not None:       # each worker's replicas on its (virtual) devices
            server_config = towers.configure(server_config or cluster.session_config())
        run.serve(server_config)
    run.prepare()
    graph = tf1.Graph()
    with graph.as_default():
        setter = device_fn(config, cluster, collective)      # one, for the model and the hooks: it counts bytes
        train_graph, spec, init_local, iterator = _build(estimator, input_fn, cluster, setter, collective, towers)
        session, all_hooks = _session(estimator, run, train_graph, spec, init_local, list(hooks or ()),
                                      saving_listeners, collective, towers)
        all_hooks += input_position(iterator, run.checkpoint_dir, train_graph.global_step, run.name,
                                    save_steps=config.save_checkpoints_steps, save_secs=config.save_checkpoints_secs,
                                    keep=(config.keep_checkpoint_max or 3) + 2)
        session.finalize(all_hooks, device=setter)
        if config.is_chief and cluster is not None and cluster.num_tasks("ps"):
            # For the launcher's --ps-memory line: what each ps holds (docs/memory.md).
            record_ps_state(placement_report(graph, devices=[t.device for t in cluster.tasks(("ps",))]).totals())
    with graph.as_default():
        try:
            session.create()
            return run_loop(session, last_step=max_steps, steps=steps, name=run.name)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as e:
            # TF's checks on the data (a label outside n_classes or the vocabulary, a string weight column) fail
            # inside a step: the op and its message say what to fix; the loop's traceback does not.
            text = cause(e)
            raise ModelFnError(f"a training step failed on its input: {text}{hint(text)}") from None
        finally:
            session.close()


def device_fn(config, cluster, collective=None):
    """Where the model's variables go: the RunConfig's ``device_fn``, else the ps by bytes, else (all-reduce) this
    worker's own copy."""
    if collective is not None:
        return collective.host
    if config.device_fn is None and cluster is not None and cluster.num_tasks("ps"):
        return ByteBalancedSetter.for_cluster(cluster)
    return config.device_fn


def _build(estimator, input_fn, cluster, setter, collective=None, towers=None):
    """The training graph: global step and model on the ps (by bytes), input on this worker's CPU; with
    ``collective``, every variable on this worker's own copy; with ``towers``, a replica on each."""
    config = estimator.config
    if config.tf_random_seed is not None:
        tf1.set_random_seed(config.tf_random_seed)
    worker_cpu = (cluster.task.device if cluster is not None else "") + "/cpu:0"
    with tf1.device(setter):
        global_step = tf1.train.get_or_create_global_step()
    features, labels, init_local, iterator = call_input_fn(input_fn, ModeKeys.TRAIN, estimator.params, config,
                                                           worker_cpu, input_context(config))
    params, hooks = estimator.params, []
    # On tfcluster's placement, a big table goes over every ps as fit's does, though model_fn gave no partitioner
    # (docs/embeddings.md); a RunConfig's own device_fn places as it says, whole.
    spread = spread_over_ps(cluster) if isinstance(setter, ByteBalancedSetter) else contextlib.nullcontext()
    # Each weight's read crosses to this worker once a step, packed per ps with the others (graph/crossing.py).
    reads = tf1.variable_creator_scope(Wire("float32", worker_cpu).creator()) \
        if isinstance(setter, ByteBalancedSetter) and towers is None else contextlib.nullcontext()
    with tf1.device(setter), spread, reads:
        if towers is not None:
            spec = build_replicas(estimator.model_fn, iterator, features, labels, params, config, towers, collective)
        elif collective is not None:
            spec = build_collective(estimator.model_fn, features, labels, params, config, collective)
        else:
            spec = call_estimator_model_fn(estimator.model_fn, features, labels, ModeKeys.TRAIN, params, config)
        if estimator.warm_start is not None:       # a checkpoint in model_dir still wins (restore)
            apply_warm_start(estimator.warm_start)
        finishes = tf1.get_collection(FINISH_COLLECTION)        # a SyncReplicasOptimizer's train op only pushes
        # Asynchronous training on the ps: the next batch's rows are fetched during this step (graph/prefetch.py).
        staging = prefetch.stage(global_step.graph, str(cluster.task)) \
            if isinstance(setter, ByteBalancedSetter) and towers is None and not finishes and prefetch.wanted() \
            else None
        puts = staging.attach(spec.train_op) if staging is not None else []
        fetch = global_step_after([spec.train_op] + puts, global_step)
        if collective is not None:
            runner, hooks = collective.finish_graph(fetch, spec.loss)
        else:
            runner = StepRunner(fetch, spec.loss)
    runner = FinishingRunner(runner, finishes) if finishes else runner
    return TrainGraph(runner, global_step, spec.loss, hooks=hooks, staging=staging), spec, init_local, iterator


def _session(estimator, run, train_graph, spec, init_local, hooks, saving_listeners, collective=None, towers=None):
    """The TrainingSession and every hook of the run, the chief's saving ones included."""
    config = estimator.config
    scaffold = spec.scaffold
    saver = summary = None
    if run.is_chief:
        saver = scaffold.saver or run.saver(max_to_keep=config.keep_checkpoint_max,
                                            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours)
        if not tf1.get_collection(tf1.GraphKeys.SAVERS):
            # As TF 1.x's Scaffold leaves its saver: a program's CheckpointSaverHook without one finds it there.
            tf1.add_to_collection(tf1.GraphKeys.SAVERS, saver)
        writer = tf1.summary.FileWriterCache.get(estimator.model_dir)
        tf1.summary.scalar("loss", spec.loss)
        summary_op = scaffold.summary_op if scaffold.summary_op is not None else tf1.summary.merge_all()
        if config.save_summary_steps and summary_op is not None:
            summary = SummaryHook(writer, summary_op, config.save_summary_steps)
    local_init = list(init_local) + ([scaffold.local_init_op] if scaffold.local_init_op is not None else [])
    session_config = _session_config(config, run.cluster, towers)
    if collective is not None:
        collective.configure(session_config)
    session = run.session(train_graph, config=session_config, saver=saver, extra_local_init=local_init,
                          init_fn=scaffold.init_fn, init_feed_dict=scaffold.init_feed_dict)
    save_steps, save_secs = config.save_checkpoints_steps, config.save_checkpoints_secs
    programs = [h for h in [*spec.training_chief_hooks, *spec.training_hooks, *hooks]
                if isinstance(h, tf1.train.CheckpointSaverHook)]
    if programs:
        # TF 1.x's Estimator adds no saver of its own when the program brings a CheckpointSaverHook, and gives
        # it the saving listeners: periodic saves are the program's, tfcluster's hook keeps only the final one
        # (and what rides on it: the done marker, a failed final save's exit).
        save_steps = save_secs = None
        programs[0]._listeners.extend(saving_listeners or ())
        saving_listeners = ()
    listening = functools.partial(ListeningCheckpointHook, listeners=saving_listeners or ())
    # The step log last: its closing line comes after the final checkpoint.
    return session, run.hooks(train_graph, session, saver=saver, save_steps=save_steps,
                              save_secs=save_secs, checkpoint_hook=listening,
                              own=[GlobalStepGuard()], summary=summary, chief=spec.training_chief_hooks,
                              after=list(spec.training_hooks) + hooks + [StepLogHook(run.name,
                                                                                     config.log_step_count_steps)])


def steps_left(estimator, max_steps) -> float:
    """How far the latest checkpoint is from ``max_steps`` (inf without a target)."""
    if max_steps is None:
        return math.inf
    latest = estimator.latest_checkpoint()
    step = checkpoint_step(latest) if latest is not None else None
    # None also for a checkpoint that cannot be read: training's restore names it and finds the newest that can.
    return max_steps - step if step is not None else max_steps
