"""DeepRec's embedding-variable names in TF1 mode, so a DeepRec program's embedding variables run unchanged.

``tf.get_embedding_variable``, ``tf.EmbeddingVariableOption`` and its options
(``InitializerOption``, ``CounterFilter``, ``CBFFilter``, ``GlobalStepEvict``,
``L2WeightEvict``), ``tf.feature_column.categorical_column_with_embedding``
with ``embedding_column`` over it, and ``tf.nn.embedding_lookup`` /
``embedding_lookup_sparse`` / ``safe_embedding_lookup_sparse`` of an embedding
variable, all served by :mod:`tfcluster.embedding` (DeepRec-AI/DeepRec
docs/docs_en/Embedding-Variable.md lists them). DeepRec's storage tiers and
other options of its own are refused in one line. Its incremental checkpoints
(docs/docs_en/Incremental-Checkpoint.md): ``tf.train.MonitoredTrainingSession``'s
``save_incremental_checkpoint_secs``, ``tf.train.CheckpointSaverHook``'s
``incremental_save_secs``, and ``incremental_save_restore`` of ``tf.train.Saver``
and ``tf.train.Scaffold`` (every restore applies increments, so it asks nothing
more), served by :mod:`tfcluster.embedding.increments`.
"""

import functools
import inspect
import logging
import os
import time

from .. import embedding
from ..core.errors import SpecError
from ..embedding import columns
from ..core import environment
from ..embedding.increments import Increments
from ..embedding.variable import rows_per_ps
from ..graph.placement import record_ps_rows
from ..training.hooks import ROWS_EVERY_SECS
from ..runtime.checkpoints import step_in_name
from .overrides import Proxy
from .overrides import train as tf1_mode_train

log = logging.getLogger("tfcluster")

#: DeepRec's option classes, served at the top of ``tensorflow`` as DeepRec has them.
OPTIONS = ("EmbeddingVariableOption", "InitializerOption", "CounterFilter", "CBFFilter", "GlobalStepEvict",
           "L2WeightEvict")


def get_embedding_variable(name, embedding_dim, key_dtype=None, value_dtype=None, initializer=None,
                           regularizer=None, trainable=True, collections=None, caching_device=None, partitioner=None,
                           validate_shape=True, custom_getter=None, constraint=None, init_data_source=None,
                           ev_option=None):
    """DeepRec's ``tf.get_embedding_variable``: an embedding variable, in as many parts as ``partitioner`` asks."""
    import tensorflow as tf
    for given, what in ((value_dtype not in (None, tf.float32), "value_dtype other than float32"),
                        (regularizer is not None, "regularizer"), (init_data_source is not None, "init_data_source"),
                        (custom_getter is not None, "custom_getter"), (constraint is not None, "constraint")):
        if given:
            raise SpecError(f"get_embedding_variable({name!r}): {what} is not served for embedding variables")
    parts = None
    if partitioner is not None:     # TF's partitioners give slices of a shape; here, one part per slice
        parts = int(partitioner(shape=tf.TensorShape([1 << 20, embedding_dim]), dtype=tf.float32)[0])
    return embedding.get_embedding_variable(name, embedding_dim, key_dtype=key_dtype, initializer=initializer,
                                            trainable=trainable, partitions=parts, ev_option=ev_option)


def _lookups(nn):
    def embedding_lookup(params, ids, *args, name=None, **kwargs):
        if isinstance(params, embedding.EmbeddingVariable):
            return params.lookup(ids, name=name)
        return nn.embedding_lookup(params, ids, *args, name=name, **kwargs)

    def embedding_lookup_sparse(params, sp_ids, sp_weights, *args, combiner=None, name=None, **kwargs):
        if isinstance(params, embedding.EmbeddingVariable):
            return columns.embedding_lookup_sparse(params, sp_ids, sp_weights, combiner or "mean", name)
        return nn.embedding_lookup_sparse(params, sp_ids, sp_weights, *args, combiner=combiner, name=name,
                                          **kwargs)

    def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None, combiner="mean",
                                     default_id=None, name=None, **kwargs):
        if isinstance(embedding_weights, embedding.EmbeddingVariable):
            return columns.embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner, name)
        return nn.safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner=combiner,
                                               default_id=default_id, name=name, **kwargs)
    return dict(embedding_lookup=embedding_lookup, embedding_lookup_sparse=embedding_lookup_sparse,
                safe_embedding_lookup_sparse=safe_embedding_lookup_sparse)


def nn(v1):
    """``tf.nn`` whose embedding lookups also take an embedding variable."""
    return Proxy(v1.nn, **_lookups(v1.nn))


def feature_column(v1):
    """``tf.feature_column`` with DeepRec's ``categorical_column_with_embedding``."""
    real = v1.feature_column
    return Proxy(real, categorical_column_with_embedding=columns.categorical_column_with_embedding,
                  embedding_column=columns.embedding_column(real.embedding_column))


def _increment_hook(v1):
    class IncrementSaverHook(v1.train.SessionRunHook):
        """Every ``secs`` seconds, the rows of embedding variables written since the last save, as an increment of
        the newest full checkpoint in ``checkpoint_dir`` (DeepRec's incremental checkpoints)."""

        def __init__(self, checkpoint_dir, secs):
            self.checkpoint_dir, self.secs = checkpoint_dir, float(secs)
            self.increments, self._last = None, time.monotonic()

        def begin(self):
            graph = v1.get_default_graph()
            if not embedding.embedding_variables(graph):
                log.warning("incremental checkpoints save the rows of embedding variables, and this model has "
                            "none; the chief saves full checkpoints only")
                return
            self.increments = Increments(graph, sharded=True)       # as TF 1.x's Scaffold saver: each ps its own
            self._step = v1.train.get_global_step(graph)

        def after_run(self, run_context, run_values):
            if self.increments is None or time.monotonic() - self._last < self.secs:
                return
            self._last = time.monotonic()
            base = v1.train.latest_checkpoint(self.checkpoint_dir)
            step = int(run_context.session.run(self._step))
            if base is not None and step > step_in_name(base):
                path = self.increments.save(run_context.session, base, step)
                log.info("saved increment %s of %s", os.path.basename(path), os.path.basename(base))
    return IncrementSaverHook


def _rows_hook(v1):
    class TableRowsHook(v1.train.SessionRunHook):
        """The chief's count of each ps's embedding-variable rows, every second, for the launcher's out-of-memory
        line (as ``fit``'s: tfcluster/training/hooks.py)."""

        def begin(self):
            self.count, self.step = rows_per_ps(v1.get_default_graph()), v1.train.get_global_step()
            self.last = None

        def after_run(self, run_context, run_values):
            if not self.count or (self.last is not None and time.monotonic() - self.last < ROWS_EVERY_SECS):
                return
            self.last = time.monotonic()
            rows, step = run_context.session.run([self.count, self.step if self.step is not None else []])
            record_ps_rows(rows, step if self.step is not None else 0)     # a program may have no global step
    return TableRowsHook


def train(v1):
    """TF1 mode's ``tf.train`` (:func:`.overrides.train`) with DeepRec's incremental-checkpoint arguments."""
    real = tf1_mode_train(v1)
    hook, rows = _increment_hook(v1), _rows_hook(v1)
    mts = real.MonitoredTrainingSession
    signature = inspect.signature(mts)

    @functools.wraps(mts)
    def MonitoredTrainingSession(*args, save_incremental_checkpoint_secs=None, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        given = bound.arguments
        chief = given.get("is_chief", True)
        more = [rows()] if chief and environment.PS_STATE_RECORD.get() and given.get("master") else []
        if save_incremental_checkpoint_secs and chief and given.get("checkpoint_dir"):
            more.append(hook(given["checkpoint_dir"], save_incremental_checkpoint_secs))
        if more:
            given["chief_only_hooks"] = list(given.get("chief_only_hooks") or []) + more
        return mts(*bound.args, **bound.kwargs)

    class Saver(real.Saver):
        """``tf.train.Saver``; ``incremental_save_restore`` is taken (every restore applies increments)."""

        def __init__(self, *args, incremental_save_restore=False, incremental_include_normal_var=False, **kwargs):
            super().__init__(*args, **kwargs)

    class Scaffold(real.Scaffold):
        """``tf.train.Scaffold``; ``incremental_save_restore`` is taken (every restore applies increments)."""

        def __init__(self, *args, incremental_save_restore=False, **kwargs):
            super().__init__(*args, **kwargs)

    class CheckpointSaverHook(real.CheckpointSaverHook):
        """``tf.train.CheckpointSaverHook``, with increments every ``incremental_save_secs`` between its saves."""

        def __init__(self, checkpoint_dir, *args, incremental_save_secs=None, **kwargs):
            super().__init__(checkpoint_dir, *args, **kwargs)
            self._increments = hook(checkpoint_dir, incremental_save_secs) if incremental_save_secs else None

        def begin(self):
            super().begin()
            if self._increments is not None:
                self._increments.begin()

        def after_run(self, run_context, run_values):
            super().after_run(run_context, run_values)
            if self._increments is not None:
                self._increments.after_run(run_context, run_values)
    return Proxy(real, MonitoredTrainingSession=MonitoredTrainingSession, Saver=Saver, Scaffold=Scaffold,
                 CheckpointSaverHook=CheckpointSaverHook)


def overrides() -> dict:
    """TF1 mode's names for DeepRec's API: ``{name: function of tf.compat.v1 making the value}``."""
    names = {"get_embedding_variable": lambda v1: get_embedding_variable, "nn": nn,
             "feature_column": feature_column, "train": train}
    names.update({option: (lambda v1, option=option: getattr(embedding, option)) for option in OPTIONS})
    return names
