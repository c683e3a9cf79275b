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

import json
import logging
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .cluster import Cluster
from .errors import SpecError, TfclusterError
from .placement import human_bytes, placement_report
from .server import serve_until_done, signal_done, start_server, wait_for_cluster
from .session import TrainingSession
from .strategies import Mode, ModelFnError, get as get_strategy
from .strategies.base import InputContext, call_model_fn

log = logging.getLogger("tfcluster")

#: The file the chief writes in the checkpoint dir after the final checkpoint.
DONE_MARKER = "tfcluster_done.json"


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


# ------------------------------------------------------------------ helpers
def resolve_cluster(cluster=None):
    """The cluster to train on: the one given, else TF_CONFIG's, else None (a single process)."""
    if cluster is not None:
        return cluster
    if os.environ.get("TF_CONFIG"):
        return Cluster.from_tf_config()
    return None


def _split(element):
    if isinstance(element, (tuple, list)) and len(element) == 2:
        return element[0], element[1]
    return element, None


def _dataset(input_fn, ctx):
    import tensorflow as tf
    ds = input_fn(ctx)
    if not isinstance(ds, tf.data.Dataset):
        raise ModelFnError(f"input_fn must return a tf.data.Dataset, got {type(ds).__name__}")
    return ds


def _local_config():
    import tensorflow as tf
    return tf.compat.v1.ConfigProto(allow_soft_placement=True)


def _checkpoint_path(checkpoint):
    """A checkpoint prefix from a prefix or a directory (its latest)."""
    import tensorflow as tf
    if checkpoint is None:
        raise SpecError("no checkpoint given: pass checkpoint= (a checkpoint dir or path)")
    if os.path.isdir(checkpoint):
        path = tf.train.latest_checkpoint(checkpoint)
        if path is None:
            raise SpecError(f"no checkpoint in {checkpoint}")
        return path
    if not _checkpoint_exists(checkpoint):
        raise SpecError(f"checkpoint {checkpoint} does not exist")
    return checkpoint


def _checkpoint_exists(prefix) -> bool:
    """True when a V2 checkpoint with this prefix is on disk (its index is written last)."""
    import tensorflow as tf
    return tf.io.gfile.exists(prefix + ".index")


def _checkpoint_step(path) -> Optional[int]:
    import tensorflow as tf
    try:
        reader = tf.train.load_checkpoint(path)
        return int(reader.get_tensor("global_step")) if reader.has_tensor("global_step") else None
    except Exception:  # a checkpoint without a readable step is still evaluable
        return None


def _prepare_checkpoint_dir(checkpoint_dir):
    """Make the chief's checkpoint dir, or fail in one line before training, not at the first save."""
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)
        # A dir that exists may still refuse files (read-only filesystem, permissions).
        with tempfile.TemporaryFile(dir=checkpoint_dir):
            pass
    except OSError as e:
        raise TfclusterError(f"cannot write checkpoint dir {checkpoint_dir}: {e.strerror}") from None
    try:
        os.remove(os.path.join(checkpoint_dir, DONE_MARKER))
    except FileNotFoundError:
        pass


def _write_done_marker(checkpoint_dir, global_step, checkpoint):
    tmp = os.path.join(checkpoint_dir, DONE_MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"global_step": int(global_step), "checkpoint": checkpoint, "time": time.time()}, f)
    os.replace(tmp, os.path.join(checkpoint_dir, DONE_MARKER))


def read_done_marker(checkpoint_dir) -> Optional[dict]:
    """The chief's done marker in ``checkpoint_dir`` (global_step, checkpoint), or None."""
    try:
        with open(os.path.join(checkpoint_dir, DONE_MARKER), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _scalar_summary(tag_values):
    import tensorflow as tf
    return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=t, simple_value=float(v))
                                       for t, v in tag_values.items()])


# ---------------------------------------------------------------------- fit
def fit(model_fn: Callable, input_fn: Callable, *, optimizer, steps: int, strategy=None,
        batch_size: Optional[int] = None, checkpoint_dir: Optional[str] = None, cluster=None,
        save_checkpoint_steps: Optional[int] = None, save_checkpoint_secs: Optional[float] = 60.0,
        summary_steps: Optional[int] = 100, log_every_secs: float = 5.0, keep_checkpoints: int = 5,
        eval_input_fn: Optional[Callable] = None, evaluator_timeout_secs: float = 600.0,
        startup_timeout: float = 300.0, max_recoveries: int = 10, seed: Optional[int] = None,
        log_placement: bool = False) -> Optional[FitResult]:
    """Train ``model_fn`` on ``input_fn``'s data until the global step reaches ``steps``.

    Plays this process's role: a ps task serves until every trainer is done
    (returns None); the evaluator runs :func:`run_evaluator` on
    ``eval_input_fn``; chief and workers train. ``strategy`` is a
    :class:`~tfcluster.strategies.Strategy` or a name (``"sync"``, ``"async"``,
    ``"local"``...; default: async with ps tasks, collective with several
    workers and no ps, local without a cluster).
    ``batch_size`` is the per-replica batch that ``input_fn`` should produce
    (``ctx.per_replica_batch``); the loss is divided by it x replicas in sync.
    The input is repeated as needed.
    """
    import tensorflow as tf
    tf1 = tf.compat.v1
    if not isinstance(steps, int) or steps < 0:
        raise SpecError(f"steps must be a whole number >= 0, got {steps!r}")
    cluster = resolve_cluster(cluster)
    task = cluster.task if cluster is not None else None
    if cluster is not None and task is None:
        raise SpecError("the cluster names no task for this process; set TF_CONFIG's 'task'")
    if task is not None and task.job == "evaluator":
        if eval_input_fn is None:
            raise SpecError("this task is the evaluator, but fit() got no eval_input_fn")
        evals = run_evaluator(model_fn, eval_input_fn, checkpoint_dir, timeout_secs=evaluator_timeout_secs,
                              batch_size=batch_size)
        last = evals[-1] if evals else {}
        return FitResult(str(task), int(last.get("global_step") or 0), evaluations=evals)
    if task is not None and task.job == "ps":
        server = start_server(cluster)
        serve_until_done(server, cluster)
        return None

    if strategy is None:
        if cluster is None or cluster.num_replicas == 1 and not cluster.num_tasks("ps"):
            strategy = "local"
        else:
            # Several workers and no ps: they must all-reduce, not train apart.
            strategy = "async" if cluster.num_tasks("ps") else "collective"
    strategy = get_strategy(strategy).bind(cluster)
    cluster = strategy.cluster          # None for a local strategy, whatever TF_CONFIG says
    name = str(cluster.task) if cluster is not None else "local"
    is_chief = strategy.is_chief
    started = time.monotonic()
    checkpoint_dir = os.path.abspath(checkpoint_dir) if checkpoint_dir else None

    server = None
    if cluster is not None:
        # The strategy may need more of the server (virtual devices for towers, a collective group leader).
        server = start_server(cluster, config=strategy.configure(cluster.session_config()))
        wait_for_cluster(cluster, timeout=startup_timeout)
    if is_chief and checkpoint_dir:
        _prepare_checkpoint_dir(checkpoint_dir)

    graph = tf1.Graph()
    with graph.as_default():
        if seed is not None:
            tf1.set_random_seed(seed)
        ctx = strategy.input_context(batch_size)
        with strategy.input_scope():
            ds = _dataset(input_fn, ctx).repeat().prefetch(tf.data.experimental.AUTOTUNE)
            iterator = tf1.data.make_initializable_iterator(ds)

        def next_batch():
            with strategy.input_scope():
                return _split(iterator.get_next())
        train_graph = strategy.build(model_fn, next_batch, optimizer, batch_size)
        with strategy.input_scope():
            saver = tf1.train.Saver(max_to_keep=keep_checkpoints, save_relative_paths=True) \
                if is_chief and checkpoint_dir else None
            summary_op = None
            if is_chief and checkpoint_dir and summary_steps:
                tf1.summary.scalar("loss", train_graph.loss)
                summary_op = tf1.summary.merge_all()
        report = placement_report(graph, devices=strategy.placement_devices())
        target = server.target if server is not None else ""
        config = strategy.configure(cluster.session_config() if cluster is not None else _local_config())
        # A strategy whose workers each own a copy (collective) initialises on every worker.
        session = TrainingSession(train_graph, target=target, config=config, is_chief=strategy.should_init,
                                  saver=saver,
                                  checkpoint_dir=checkpoint_dir, extra_local_init=[iterator.initializer],
                                  cluster=cluster, name=name, startup_timeout=startup_timeout,
                                  max_recoveries=max_recoveries, summary_op=summary_op)
        read_step = train_graph.global_step.read_value()
        graph.finalize()  # no op may be added per step: a growing graph is a slow leak

    if is_chief:
        log.info("%s trains with %s, %d replica(s) in sync, per-replica batch %s", name, strategy.describe(),
                 strategy.num_replicas_in_sync, batch_size if batch_size is not None else "(from input_fn)")
        if strategy.placement_devices():
            totals = ", ".join(f"{d} {human_bytes(b)}" for d, b in report.totals().items())
            log.info("placement: %s (imbalance %.1f%%)", totals, 100 * report.imbalance())
        if log_placement:
            log.info("%s", report.format())

    with graph.as_default():
        writer = tf1.summary.FileWriter(checkpoint_dir) if is_chief and checkpoint_dir else None
        try:
            session.create()
            # Examples per step of this process: one batch per replica it hosts (towers).
            result = _train_loop(session, read_step, steps, name, is_chief, saver, writer, checkpoint_dir,
                                 save_checkpoint_steps, save_checkpoint_secs, summary_steps, log_every_secs,
                                 (batch_size or 0) * strategy.replicas_per_worker, started)
            session.end()
        finally:
            if writer is not None:
                writer.close()
            session.close()
    if cluster is not None and cluster.num_tasks("ps"):
        told = signal_done(cluster)
        log.debug("%s told %d ps task(s) it is done", name, told)
    return result


def _train_loop(session, read_step, steps, name, is_chief, saver, writer, checkpoint_dir,
                save_steps, save_secs, summary_steps, log_every_secs, batch_size, started):
    gs = int(session.call(lambda s: s.run(read_step)))
    if gs >= steps:
        log.info("%s: global step %d already reaches %d; nothing to train", name, gs, steps)
    last_save_step, last_save_time = gs, time.monotonic()
    checkpoint = session.restored_from
    local_steps = 0
    window_loss, window_n, window_steps = 0.0, 0, 0
    t0 = window_t = time.monotonic()
    next_log = t0 + log_every_secs
    first_step_at = None
    timeline, next_mark = [], t0
    batch = batch_size or 0

    def save(step):
        path = session.call(lambda s: saver.save(s, os.path.join(checkpoint_dir, "model.ckpt"), global_step=step,
                                                 write_meta_graph=False))
        log.info("%s saved checkpoint %s", name, os.path.basename(path))
        return path

    while gs < steps:
        want_summary = writer is not None and summary_steps and local_steps % summary_steps == 0
        r = session.step(want_summary)
        gs = r.global_step
        local_steps += 1
        window_steps += 1
        if r.loss == r.loss:  # a step whose wait timed out has no loss
            window_loss += r.loss
            window_n += 1
        if r.extra is not None:
            writer.add_summary(r.extra, gs)
        now = time.monotonic()
        if now >= next_mark:
            timeline.append((time.time(), local_steps))
            next_mark = now + 0.5
        if first_step_at is None:
            first_step_at = time.time()
            log.info("%s first step done at t=%.3f (%.1fs after start), global step %d", name, first_step_at,
                     now - started, gs)
        if now >= next_log:
            dt = now - window_t
            sps = window_steps / dt
            loss = window_loss / window_n if window_n else math.nan
            log.info("%s step %d (global %d) loss %.4f | %.1f steps/s %.0f examples/s", name, local_steps, gs,
                     loss, sps, sps * batch)
            if writer is not None:
                writer.add_summary(_scalar_summary({"steps_per_sec": sps, "examples_per_sec": sps * batch}), gs)
            window_loss, window_n, window_steps, window_t = 0.0, 0, 0, now
            next_log = now + log_every_secs
        if saver is not None and gs < steps and (
                (save_steps and gs - last_save_step >= save_steps)
                or (save_secs and now - last_save_time >= save_secs)):
            checkpoint = save(gs)
            last_save_step, last_save_time = gs, now

    elapsed = time.monotonic() - t0
    last_step_at = time.time()
    timeline.append((last_step_at, local_steps))
    if saver is not None:
        if gs != last_save_step or checkpoint is None:
            checkpoint = save(gs)
        _write_done_marker(checkpoint_dir, gs, checkpoint)
    final_loss = window_loss / window_n if window_n else math.nan
    sps = local_steps / elapsed if elapsed > 0 else 0.0
    log.info("%s done: global step %d, %d local step(s) in %.1fs, %.1f steps/s %.0f examples/s", name, gs,
             local_steps, elapsed, sps, sps * batch)
    return FitResult(name, gs, local_steps, final_loss, elapsed, sps, sps * batch, checkpoint, first_step_at,
                     last_step_at=last_step_at, timeline=timeline)


# ------------------------------------------------------- evaluate / predict
class _EvalGraph:
    """A plain single-process graph for evaluating or predicting: no cluster, no device pins."""

    def __init__(self, model_fn, input_fn, mode, batch_size=None):
        import tensorflow as tf
        tf1 = tf.compat.v1
        self.graph = tf1.Graph()
        with self.graph.as_default():
            ds = _dataset(input_fn, InputContext(1, 0, batch_size, 1))
            self.iterator = tf1.data.make_initializable_iterator(ds.prefetch(tf.data.experimental.AUTOTUNE))
            features, labels = _split(self.iterator.get_next())
            if mode == Mode.EVAL and labels is None:
                raise ModelFnError("evaluate needs an input_fn whose dataset yields (features, labels)")
            out = call_model_fn(model_fn, features, None if mode == Mode.PREDICT else labels, mode)
            if not tf1.global_variables():
                raise ModelFnError("model_fn created no variables; there is nothing to restore")
            self.saver = tf1.train.Saver()
            if mode == Mode.EVAL:
                per_example = tf.cast(out.per_example_loss, tf.float32)
                if per_example.shape.rank > 1:
                    per_example = tf.reduce_sum(per_example, axis=list(range(1, per_example.shape.rank)))
                metrics = {"loss": tf1.metrics.mean(per_example)}
                for k, v in (out.metrics or {}).items():
                    if not (isinstance(v, (tuple, list)) and len(v) == 2):
                        raise ModelFnError(f"metric {k!r} must be a (value, update_op) pair, "
                                           "as tf.compat.v1.metrics.* return")
                    metrics[k] = v
                self.values = {k: v[0] for k, v in metrics.items()}
                self.update = tf.group(*[v[1] for v in metrics.values()])
            else:
                self.predictions = out.predictions
            self.local_init = tf.group(tf1.local_variables_initializer(), tf1.tables_initializer(),
                                       self.iterator.initializer)
            self.graph.finalize()

    def session(self, checkpoint_path):
        import tensorflow as tf
        sess = tf.compat.v1.Session(graph=self.graph, config=_local_config())
        try:
            with self.graph.as_default():
                self.saver.restore(sess, checkpoint_path)
        except tf.errors.NotFoundError as e:
            sess.close()
            raise TfclusterError(f"checkpoint {checkpoint_path} does not match model_fn: "
                                 f"{str(e).strip().splitlines()[0]}") from None
        sess.run(self.local_init)
        return sess

    def evaluate(self, checkpoint_path, steps=None) -> dict:
        import tensorflow as tf
        with self.session(checkpoint_path) as sess:
            update = sess.make_callable(self.update)
            n = 0
            try:
                while steps is None or n < steps:
                    update()
                    n += 1
            except tf.errors.OutOfRangeError:
                pass
            if n == 0:
                raise TfclusterError("evaluation input is empty; input_fn yielded no batch")
            values = sess.run(self.values)
        out = {k: float(v) for k, v in values.items()}
        out["global_step"] = _checkpoint_step(checkpoint_path)
        out["batches"] = n
        return out


def evaluate(model_fn, input_fn, checkpoint, *, steps: Optional[int] = None,
             batch_size: Optional[int] = None) -> dict:
    """Metrics of a checkpoint (a dir's latest, or a path) over ``input_fn``'s finite data, in one process.

    Returns ``{"loss": mean per-example loss, <model metrics>..., "global_step", "batches"}``.
    """
    path = _checkpoint_path(checkpoint)
    return _EvalGraph(model_fn, input_fn, Mode.EVAL, batch_size).evaluate(path, steps)


def predict(model_fn, input_fn, checkpoint, *, batch_size: Optional[int] = None):
    """Predictions of a checkpoint over ``input_fn``'s data, in one process: an array, or a dict of arrays."""
    import numpy as np
    import tensorflow as tf
    path = _checkpoint_path(checkpoint)
    g = _EvalGraph(model_fn, input_fn, Mode.PREDICT, batch_size)
    chunks = []
    with g.session(path) as sess:
        run = sess.make_callable(g.predictions)
        try:
            while True:
                chunks.append(run())
        except tf.errors.OutOfRangeError:
            pass
    if not chunks:
        return chunks
    if isinstance(chunks[0], dict):
        return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    return np.concatenate(chunks)


# ---------------------------------------------------------------- evaluator
def _checkpoints_in(checkpoint_dir) -> list:
    import tensorflow as tf
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    return [p if os.path.isabs(p) else os.path.join(checkpoint_dir, p) for p in paths]


def run_evaluator(model_fn, input_fn, checkpoint_dir, *, timeout_secs: float = 600.0, poll_secs: float = 1.0,
                  steps: Optional[int] = None, batch_size: Optional[int] = None) -> list:
    """Evaluate each new checkpoint in ``checkpoint_dir`` until the chief's done marker appears.

    The evaluator is outside the training cluster (nobody waits for it,
    pitfalls item 12). It logs one metric line per checkpoint, writes eval
    summaries to ``checkpoint_dir/eval``, and returns the list of results.
    It gives up when ``timeout_secs`` pass without a new checkpoint.
    """
    import tensorflow as tf
    if not checkpoint_dir:
        raise SpecError("the evaluator needs the training run's checkpoint_dir")
    checkpoint_dir = os.path.abspath(checkpoint_dir)
    g = _EvalGraph(model_fn, input_fn, Mode.EVAL, batch_size)
    with g.graph.as_default():
        writer = tf.compat.v1.summary.FileWriter(os.path.join(checkpoint_dir, "eval"))
    seen, results = set(), []
    last_new = time.monotonic()
    log.info("evaluator watches %s (gives up after %gs without a new checkpoint)", checkpoint_dir, timeout_secs)
    try:
        while True:
            done = read_done_marker(checkpoint_dir)
            new = [p for p in _checkpoints_in(checkpoint_dir) if p not in seen]
            for path in new:
                if not _checkpoint_exists(path):
                    seen.add(path)  # already rotated away by the chief
                    continue
                try:
                    metrics = g.evaluate(path, steps)
                except tf.errors.NotFoundError:
                    seen.add(path)
                    continue
                seen.add(path)
                last_new = time.monotonic()
                metrics["checkpoint"] = path
                results.append(metrics)
                shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items()
                                 if k not in ("global_step", "batches", "checkpoint"))
                log.info("evaluator: %s (global step %s): %s", os.path.basename(path), metrics["global_step"],
                         shown)
                writer.add_summary(_scalar_summary({k: v for k, v in metrics.items()
                                                    if isinstance(v, float)}), metrics["global_step"] or 0)
                writer.flush()
            if done is not None:
                final = done.get("checkpoint")
                final = final if final is None or os.path.isabs(final) else os.path.join(checkpoint_dir, final)
                if final is None or final in seen:
                    log.info("evaluator: training is done (global step %s); exiting", done.get("global_step"))
                    return results
            if time.monotonic() - last_new > timeout_secs:
                raise TfclusterError(f"evaluator: no new checkpoint in {checkpoint_dir} for {timeout_secs:g}s "
                                     "and no done marker; is training running?")
            time.sleep(poll_secs)
    finally:
        writer.close()
