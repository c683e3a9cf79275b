"""``tf.estimator.train_and_evaluate``: each task of TF_CONFIG plays its role, and the run ends by itself.

- no cluster: train, evaluating after each checkpoint once ``throttle_secs``
  passed, and once more at the end (then the exporters);
- ``ps``: serve the variables until every trainer is done, then exit (TF 1.x's
  ps sat in ``server.join()`` forever, docs/pitfalls.md item 2);
- ``chief`` (or ``master``) and ``worker``: train to ``max_steps``, then tell
  the ps tasks they are done;
- ``evaluator``: outside the cluster, evaluate each new checkpoint (and run
  the exporters) until the chief's final one, then exit.
"""

import collections
import logging
import os
import time

import tensorflow as tf

from ..core.errors import SpecError
from ..runtime.shutdown import done_when_finished
from ..topology.cluster import Role
from ..training.assembly import part_of
from ..training.checkpoint_watch import watch_checkpoints

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")



class TrainSpec(collections.namedtuple("TrainSpec", ["input_fn", "max_steps", "hooks", "saving_listeners"])):
    """What to train on and until when (TF 1.x's ``tf.estimator.TrainSpec``)."""

    def __new__(cls, input_fn, max_steps=None, hooks=None, saving_listeners=None):
        if not callable(input_fn):
            raise SpecError("TrainSpec: input_fn must be callable")
        if max_steps is not None and max_steps <= 0:
            raise SpecError(f"TrainSpec: max_steps must be > 0, got {max_steps}")
        return super().__new__(cls, input_fn, max_steps, tuple(hooks or ()), tuple(saving_listeners or ()))


class EvalSpec(collections.namedtuple("EvalSpec", ["input_fn", "steps", "name", "hooks", "exporters",
                                                   "start_delay_secs", "throttle_secs"])):
    """What to evaluate on, how often, and what to export (TF 1.x's ``tf.estimator.EvalSpec``)."""

    def __new__(cls, input_fn, steps=100, name=None, hooks=None, exporters=None, start_delay_secs=120,
                throttle_secs=600):
        if not callable(input_fn):
            raise SpecError("EvalSpec: input_fn must be callable")
        if steps is not None and steps <= 0:
            raise SpecError(f"EvalSpec: steps must be > 0 or None, got {steps}")
        if start_delay_secs < 0 or throttle_secs < 0:
            raise SpecError("EvalSpec: start_delay_secs and throttle_secs must be >= 0")
        if exporters is None:
            exporters = ()
        elif not isinstance(exporters, (list, tuple)):
            exporters = (exporters,)
        return super().__new__(cls, input_fn, steps, name, tuple(hooks or ()), tuple(exporters),
                               start_delay_secs, throttle_secs)


def train_and_evaluate(estimator, train_spec, eval_spec):
    """Train and evaluate as this task's role in TF_CONFIG asks; ``(eval result, export results)``."""
    if not isinstance(train_spec, TrainSpec) or not isinstance(eval_spec, EvalSpec):
        raise SpecError("train_and_evaluate takes a tf.estimator.TrainSpec and a tf.estimator.EvalSpec")
    config = estimator.config
    cluster = config.cluster
    if cluster is None:
        return _run_local(estimator, train_spec, eval_spec)
    role = part_of(cluster, "train_and_evaluate")
    if role is Role.PS:
        return None, None
    if role is Role.EVALUATOR:
        return _run_evaluator(estimator, train_spec, eval_spec)
    with done_when_finished(cluster):
        estimator.train(train_spec.input_fn, hooks=train_spec.hooks, max_steps=train_spec.max_steps,
                        saving_listeners=train_spec.saving_listeners)
    return None, None


class _Evaluations:
    """Evaluate a checkpoint, then run the exporters; remember the last result."""

    def __init__(self, estimator, eval_spec):
        self.estimator, self.spec = estimator, eval_spec
        self.result, self.exports, self.last_at, self.checkpoint = None, [], 0.0, None

    def __call__(self, checkpoint, final: bool):
        """Evaluate ``checkpoint`` and run the exporters on it."""
        s = self.spec
        self.checkpoint = checkpoint
        self.result = self.estimator.evaluate(s.input_fn, steps=s.steps, hooks=s.hooks, checkpoint_path=checkpoint,
                                              name=s.name)
        self.last_at = time.monotonic()
        self.exports = []
        for exporter in s.exporters:
            base = os.path.join(self.estimator.model_dir, "export", exporter.name)
            path = exporter.export(self.estimator, base, checkpoint, self.result, final)
            if path is not None:
                self.exports.append(path)
        return self.result


class _EvaluateAfterSaves(tf1.train.CheckpointSaverListener):
    """Evaluate after a checkpoint save once ``throttle_secs`` passed since the last evaluation."""

    def __init__(self, evaluations, throttle_secs):
        self.evaluations, self.throttle_secs = evaluations, throttle_secs

    def after_save(self, session, global_step_value):
        """Evaluate the checkpoint just written, unless the last evaluation is too recent."""
        if time.monotonic() - self.evaluations.last_at >= self.throttle_secs:
            self.evaluations(self.evaluations.estimator.latest_checkpoint(), final=False)


def _run_local(estimator, train_spec, eval_spec):
    evaluations = _Evaluations(estimator, eval_spec)
    evaluations.last_at = time.monotonic()
    listeners = list(train_spec.saving_listeners) + [_EvaluateAfterSaves(evaluations, eval_spec.throttle_secs)]
    estimator.train(train_spec.input_fn, hooks=train_spec.hooks, max_steps=train_spec.max_steps,
                    saving_listeners=listeners)
    latest = estimator.latest_checkpoint()
    if latest != evaluations.checkpoint or eval_spec.exporters:
        evaluations(latest, final=True)
    return evaluations.result, evaluations.exports


def _run_evaluator(estimator, train_spec, eval_spec, poll_secs: float = 1.0):
    """Evaluate the newest checkpoint when due, until the final one (:mod:`tfcluster.training.checkpoint_watch`)."""
    evaluations = _Evaluations(estimator, eval_spec)
    log.info("evaluator: first evaluation after %gs, then at most every %gs", eval_spec.start_delay_secs,
             eval_spec.throttle_secs)
    watch_checkpoints(estimator.model_dir, evaluations, poll_secs=poll_secs, newest_only=True,
                      start_delay_secs=eval_spec.start_delay_secs, throttle_secs=eval_spec.throttle_secs,
                      final_step=train_spec.max_steps)
    return evaluations.result, evaluations.exports
