"""Evaluate and predict from a checkpoint in one plain process, and the evaluator task.

A checkpoint written by a cluster restores here with no cluster and no
strategy (its variables carry no device, docs/pitfalls.md item 9): ``evaluate``
runs ``model_fn`` in EVAL mode over finite data and returns its metrics,
``predict`` returns its predictions, and :func:`run_evaluator` is the
evaluator task of a cluster, evaluating each new checkpoint until the chief's
done marker appears.
"""

import logging
import os
from typing import Optional

from ..core.errors import ModelFnError, SpecError, TfclusterError
from ..data.pipeline import without_autotune_thread
from ..graph.model import InputContext, Mode, call_model_fn, make_dataset, per_example_losses, split_element
from ..runtime.checkpoints import checkpoint_step, resolve_checkpoint, restore_error
from .checkpoint_watch import EVALUATOR_TIMEOUT_SECS, watch_checkpoints
from .hooks import scalar_summary

log = logging.getLogger("tfcluster")


def local_config():
    """The ConfigProto of a single process: soft placement on."""
    import tensorflow as tf
    return tf.compat.v1.ConfigProto(allow_soft_placement=True)


class _EvalGraph:
    """A plain single-process graph for evaluating or predicting: no cluster, no device pins."""

    def __init__(self, model_fn, input_fn, mode, batch_size=None):
        import tensorflow as tf
        tf1 = tf.compat.v1
        self.graph = tf1.Graph()
        with self.graph.as_default():
            ds = make_dataset(input_fn, InputContext(1, 0, batch_size, 1))
            self.iterator = tf1.data.make_initializable_iterator(
                without_autotune_thread(ds.prefetch(tf.data.experimental.AUTOTUNE)))
            features, labels = split_element(self.iterator.get_next())
            if mode == Mode.EVAL and labels is None:
                raise ModelFnError("evaluate needs an input_fn whose dataset yields (features, labels)")
            out = call_model_fn(model_fn, features, None if mode == Mode.PREDICT else labels, mode)
            if not tf1.global_variables():
                raise ModelFnError("model_fn created no variables; there is nothing to restore")
            self.saver = tf1.train.Saver()
            if mode == Mode.EVAL:
                metrics = {"loss": tf1.metrics.mean(per_example_losses(out))}
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
        sess = tf.compat.v1.Session(graph=self.graph, config=local_config())
        try:
            with self.graph.as_default():
                self.saver.restore(sess, checkpoint_path)
        except (tf.errors.NotFoundError, tf.errors.DataLossError, tf.errors.OutOfRangeError,
                ValueError) as e:   # ValueError: Saver.restore of a checkpoint whose files were rotated away
            sess.close()
            raise restore_error(checkpoint_path, e) from None
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
        out["global_step"] = checkpoint_step(checkpoint_path)
        out["batches"] = n
        return out


def evaluate(model_fn, input_fn, checkpoint, *, steps: Optional[int] = None,
             batch_size: Optional[int] = None) -> dict:
    """Metrics of a checkpoint (a dir's latest, or a path) over ``input_fn``'s finite data, in one process.

    Returns ``{"loss": mean per-example loss, <model metrics>..., "global_step", "batches"}``.
    """
    path = resolve_checkpoint(checkpoint)
    return _EvalGraph(model_fn, input_fn, Mode.EVAL, batch_size).evaluate(path, steps)


def predict(model_fn, input_fn, checkpoint, *, batch_size: Optional[int] = None):
    """Predictions of a checkpoint over ``input_fn``'s data, in one process: an array, or a dict of arrays."""
    import numpy as np
    import tensorflow as tf
    path = resolve_checkpoint(checkpoint)
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
def run_evaluator(model_fn, input_fn, checkpoint_dir, *, timeout_secs: float = EVALUATOR_TIMEOUT_SECS,
                  poll_secs: float = 1.0, steps: Optional[int] = None, batch_size: Optional[int] = None) -> list:
    """Evaluate each new checkpoint in ``checkpoint_dir`` until the chief's done marker appears.

    The evaluator is outside the training cluster (nobody waits for it,
    pitfalls item 12). It logs one metric line per checkpoint, writes eval
    summaries to ``checkpoint_dir/eval``, and returns the list of results.
    It gives up when ``timeout_secs`` pass without a new checkpoint
    (:func:`tfcluster.training.checkpoint_watch.watch_checkpoints`).
    """
    import tensorflow as tf
    if not checkpoint_dir:
        raise SpecError("the evaluator needs the training run's checkpoint_dir")
    checkpoint_dir = os.path.abspath(checkpoint_dir)
    g = _EvalGraph(model_fn, input_fn, Mode.EVAL, batch_size)
    with g.graph.as_default():
        writer = tf.compat.v1.summary.FileWriter(os.path.join(checkpoint_dir, "eval"))
    results = []

    def evaluate(path, final):
        metrics = g.evaluate(path, steps)
        metrics["checkpoint"] = os.path.join(checkpoint_dir, os.path.basename(path))     # not its pinned copy
        results.append(metrics)
        shown = " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k not in ("global_step", "batches", "checkpoint"))
        log.info("evaluator: %s (global step %s): %s", os.path.basename(path), metrics["global_step"], shown)
        writer.add_summary(scalar_summary({k: v for k, v in metrics.items() if isinstance(v, float)}),
                           metrics["global_step"] or 0)
        writer.flush()
    try:
        watch_checkpoints(checkpoint_dir, evaluate, timeout_secs=timeout_secs, poll_secs=poll_secs)
    finally:
        writer.close()
    return results
