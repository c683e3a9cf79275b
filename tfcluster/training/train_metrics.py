"""Training metrics that every replica adds to, and epochs, as the tutorials use them.

``model_fn``'s ``metrics`` (``{name: tf.compat.v1.metrics.*(...)}``) update with
every training step. Under a parameter-server strategy their running totals
live on the ps, like the model, so every worker adds to the same totals and
the value is over every replica's examples (the tutorials' ``train_accuracy``).
The chief creates them, resets them at each epoch, and reports them at each
epoch's end; every worker reports them with its progress lines; the chief
writes them to TensorBoard. Under other strategies each process reports the
totals of its own replicas (towers in one process: the first tower's).

An epoch is the data set once over: ``epochs`` x ``steps_per_epoch`` global
steps, where a step consumes :meth:`Strategy.examples_per_step` examples.
"""

import logging
import math

from ..core.errors import SpecError
from ..graph.model import InputContext, make_dataset
from ..graph.step import Hook, RunArgs
from .hooks import scalar_summary
from .timer import Every

log = logging.getLogger("tfcluster")


def examples_in(input_fn) -> int:
    """How many examples ``input_fn`` yields in one pass, read from its dataset without iterating it.

    ``input_fn`` is asked for one pipeline at batch 1, so that its dataset's
    cardinality is its number of examples; a dataset that repeats, or whose
    length TensorFlow cannot tell, is refused in one line.
    """
    import tensorflow as tf
    with tf.compat.v1.Graph().as_default():
        ds = make_dataset(input_fn, InputContext(1, 0, 1, 1))
        n = tf.data.experimental.cardinality(ds)
        with tf.compat.v1.Session() as session:
            count = int(session.run(n))
    if count < 0:
        raise SpecError("epochs needs the size of the data: input_fn's dataset repeats or its length is unknown; "
                        "pass examples_per_epoch=N, or steps=", params=["epochs"])
    return count


def steps_for_epochs(epochs: int, examples: int, examples_per_step: int) -> int:
    """Global steps of ``epochs`` passes over ``examples``."""
    return epochs * max(1, math.ceil(examples / examples_per_step))


class SharedMetrics:
    """The training metrics of a built graph: their totals shared where the model is, one value op each."""

    def __init__(self, train_graph):
        import tensorflow as tf
        tf1 = tf.compat.v1
        metrics = getattr(train_graph.model, "metrics", None) or {}
        self.values = {name: pair[0] for name, pair in metrics.items()}
        totals = [v for v in tf1.get_collection(tf1.GraphKeys.METRIC_VARIABLES)]
        self.shared = [v for v in totals if "/job:ps" in (v.device or "")]
        if self.shared:
            # Not worker-local: each worker's session would reset them when it starts. The chief
            # creates them once; the others wait for them like for the model.
            local = tf1.get_collection_ref(tf1.GraphKeys.LOCAL_VARIABLES)
            local[:] = [v for v in local if all(v is not s for s in self.shared)]
            for v in self.shared:
                train_graph.add_state(v)
        self.reset = tf1.variables_initializer(totals) if totals else None

    def __bool__(self):
        return bool(self.values)


class TrainMetricsHook(Hook):
    """Reports the training metrics every ``every_secs``, and, on the chief, at each epoch's end (then resets)."""

    def __init__(self, metrics: SharedMetrics, name: str, every_secs: float, chief: bool, writer=None,
                 steps_per_epoch=None, epochs=None):
        self.metrics, self.name, self.every_secs, self.chief = metrics, name, every_secs, chief
        self.writer, self.steps_per_epoch, self.epochs = writer, steps_per_epoch, epochs
        self._every = Every(secs=every_secs)
        self._every.mark(0)
        self._epoch = None

    def before_run(self, run_context):
        """Fetch the values with the step when a report is due."""
        if self._every.due(run_context.local_steps):
            return RunArgs(self.metrics.values)
        return None

    def after_run(self, run_context, run_values):
        """Report what was fetched; at an epoch's end the chief reports the epoch and resets the totals."""
        gs = run_values.global_step
        if run_values.results is not None:
            self._every.mark(run_context.local_steps)
            log.info("%s step %d train %s", self.name, gs, _format(run_values.results))
            self._write(run_values.results, gs)
        if not (self.chief and self.steps_per_epoch):
            return
        epoch = gs // self.steps_per_epoch
        if self._epoch is None:
            self._epoch = epoch
        elif epoch > self._epoch:
            values = run_context.call(lambda s: s.run(self.metrics.values))
            log.info("%s epoch %d of %s done (global step %d): train %s", self.name, epoch,
                     self.epochs or "?", gs, _format(values))
            self._write({f"epoch_{k}": v for k, v in values.items()}, gs)
            if self.metrics.reset is not None:
                run_context.call(lambda s: s.run(self.metrics.reset))
            self._epoch = epoch

    def _write(self, values, gs):
        if self.writer is not None and self.chief:
            self.writer.add_summary(scalar_summary({f"train/{k}": v for k, v in values.items()}), gs)


def _format(values) -> str:
    return " ".join(f"{k} {float(v):.4f}" for k, v in sorted(values.items()))
