"""Evaluating and predicting with an Estimator: one plain process, a checkpoint, and the hooks around each run.

As in TF 1.x, ``evaluate`` and ``predict`` run in the calling process with
no cluster (``evaluation_master`` is ``''``): the checkpoint carries no
device, so it restores anywhere (docs/pitfalls.md, item 9).
"""

import logging
import os
import weakref

import numpy as np
import tensorflow as tf

from ..core.errors import TfclusterError
from ..graph.step import StepContext, StepValues
from ..runtime.checkpoints import checkpoint_exists, restore_error
from ..training.loop import merge_requests
from .calls import call_input_fn, call_estimator_model_fn
from .spec import ModeKeys

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")
_inference_graphs = weakref.WeakSet()


def only_infers(graph) -> bool:
    """True for a graph tfcluster built to evaluate, predict or export: its local sessions train nothing."""
    return graph in _inference_graphs


def inference_graph():
    """A new graph that :func:`only_infers`."""
    graph = tf1.Graph()
    _inference_graphs.add(graph)
    return graph


class _PlainSession:
    """What hooks' run contexts need of a session: the session itself, and calls on it."""

    def __init__(self, session):
        self.session = session

    def call(self, fn):
        """``fn(session)``."""
        return fn(self.session)


def _checkpoint(estimator, checkpoint_path):
    path = checkpoint_path or estimator.latest_checkpoint()
    if path is None:
        log.warning("no checkpoint in %s: the model is evaluated with its initial values", estimator.model_dir)
    elif not checkpoint_exists(path):
        raise TfclusterError(f"checkpoint {path} does not exist")
    return path


def _open(graph, path, local_init):
    """A local session on ``graph`` with ``path`` restored (or everything initialised), local state ready."""
    session = tf1.Session(graph=graph, config=tf1.ConfigProto(allow_soft_placement=True))
    with graph.as_default():
        if path is None:
            session.run(tf1.global_variables_initializer())
        else:
            try:
                tf1.train.Saver().restore(session, path)
            except (tf.errors.NotFoundError, tf.errors.DataLossError, tf.errors.OutOfRangeError,
                    ValueError) as e:   # ValueError: Saver.restore of a checkpoint whose files were rotated away
                session.close()
                raise restore_error(path, e) from None
        session.run(local_init)
    return session


def _runs(session, hooks, fetch, steps=None):
    """Run ``fetch`` until the input ends (or ``steps`` runs), each hook around each run; yields each result."""
    ctx = StepContext(_PlainSession(session), float("inf"))
    for h in hooks:
        h.after_create_session(session, None)
    while (steps is None or ctx.local_steps < steps) and not ctx.stop_requested:
        requests = [h.before_run(ctx) for h in hooks]
        merged = merge_requests(requests)
        try:
            if merged is None:
                value, results = session.run(fetch), None
            else:
                value, results = session.run([fetch, merged.fetches], feed_dict=merged.feed_dict,
                                             options=merged.options)
        except tf.errors.OutOfRangeError:
            break
        ctx.local_steps += 1
        k = 0
        for h, r in zip(hooks, requests):
            mine = None
            if r is not None:
                mine, k = results[k], k + 1
            h.after_run(ctx, StepValues(mine, None, None, -1, float("nan")))
        yield value
    for h in hooks:
        h.end(session)


def evaluate(estimator, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None) -> dict:
    """The metrics of ``model_fn``'s EVAL mode over ``input_fn`` (all of it, or ``steps`` batches)."""
    path = _checkpoint(estimator, checkpoint_path)
    graph = inference_graph()
    with graph.as_default():
        if estimator.config.tf_random_seed is not None:
            tf1.set_random_seed(estimator.config.tf_random_seed)
        global_step = tf1.train.get_or_create_global_step()
        features, labels, init, _ = call_input_fn(input_fn, ModeKeys.EVAL, estimator.params, estimator.config)
        spec = call_estimator_model_fn(estimator.model_fn, features, labels, ModeKeys.EVAL, estimator.params,
                                       estimator.config)
        metrics = dict(spec.eval_metric_ops)
        metrics.setdefault("loss", tf1.metrics.mean(spec.loss))
        update = tf.group(*[op for _, op in metrics.values()])
        values = {k: v for k, (v, _) in metrics.items()}
        all_hooks = list(spec.evaluation_hooks) + list(hooks or ())
        for h in all_hooks:
            h.begin()
        local_init = tf.group(tf1.local_variables_initializer(), tf1.tables_initializer(), *init)
    session = _open(graph, path, local_init)
    try:
        batches = sum(1 for _ in _runs(session, all_hooks, update, steps))
        if not batches:
            raise TfclusterError("evaluation input is empty: input_fn yielded no batch")
        result = {k: _scalar(v) for k, v in session.run(values).items()}
        result[tf1.GraphKeys.GLOBAL_STEP] = int(session.run(global_step))
    finally:
        session.close()
    with graph.as_default():    # TF's summary writer is a graph-mode object
        _write_summary(estimator.model_dir, name, result)
    log.info("Saving dict for global step %d: %s", result["global_step"],
             ", ".join(f"{k} = {v:g}" for k, v in sorted(result.items()) if k != "global_step"
                       and isinstance(v, float)))
    return result


def _scalar(value):
    value = np.asarray(value)
    return float(value) if value.shape == () and np.issubdtype(value.dtype, np.floating) else value


def _write_summary(model_dir, name, result):
    eval_dir = os.path.join(model_dir, "eval" if not name else f"eval_{name}")
    writer = tf1.summary.FileWriterCache.get(eval_dir)
    summary = tf1.Summary(value=[tf1.Summary.Value(tag=k, simple_value=v) for k, v in result.items()
                                 if isinstance(v, float)])
    writer.add_summary(summary, result["global_step"])
    writer.flush()


def predict(estimator, input_fn, predict_keys=None, hooks=None, checkpoint_path=None, yield_single_examples=True):
    """Predictions of ``model_fn``'s PREDICT mode over ``input_fn``: one example (or one batch) at a time."""
    path = _checkpoint(estimator, checkpoint_path)
    graph = inference_graph()
    with graph.as_default():
        tf1.train.get_or_create_global_step()
        features, _, init, _ = call_input_fn(input_fn, ModeKeys.PREDICT, estimator.params, estimator.config)
        spec = call_estimator_model_fn(estimator.model_fn, features, None, ModeKeys.PREDICT, estimator.params,
                                       estimator.config)
        predictions = _select(spec.predictions, predict_keys)
        all_hooks = list(spec.prediction_hooks) + list(hooks or ())
        for h in all_hooks:
            h.begin()
        local_init = tf.group(tf1.local_variables_initializer(), tf1.tables_initializer(), *init)
    session = _open(graph, path, local_init)
    try:
        for batch in _runs(session, all_hooks, predictions):
            if not yield_single_examples:
                yield batch
                continue
            if isinstance(batch, dict):
                n = len(next(iter(batch.values())))
                for i in range(n):
                    yield {k: v[i] for k, v in batch.items()}
            else:
                yield from batch
    finally:
        session.close()


def _select(predictions, keys):
    if keys is None:
        return predictions
    if not isinstance(predictions, dict):
        raise TfclusterError("predict_keys needs model_fn to return predictions as a dict")
    keys = [keys] if isinstance(keys, str) else list(keys)
    missing = [k for k in keys if k not in predictions]
    if missing:
        raise TfclusterError(f"predict_keys {missing} are not among the predictions: {sorted(predictions)}")
    return {k: predictions[k] for k in keys}
