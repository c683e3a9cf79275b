"""``tf.estimator.Estimator`` for TF 1.x programs, on tfcluster's cluster, session, placement and recovery.

``Estimator(model_fn, model_dir, config, params)`` with ``train``,
``evaluate``, ``predict`` and ``export_saved_model``, as TF 1.x had them (see
docs/estimator.md for exactly what is covered). Training runs as this task's
role in TF_CONFIG (:mod:`.training_graph`); evaluation, prediction and export
run in the calling process from a checkpoint (:mod:`.inference`, :mod:`.export`).
"""

import logging
import os
import tempfile

import tensorflow as tf

from ..core.checks import whole_number
from ..core.errors import SpecError
from ..graph.sparse import install as install_distinct_lookups
from . import export as export_lib
from . import inference
from . import warm_start as warm_start_lib
from .calls import check_model_fn
from .run_config import RunConfig
from .training_graph import steps_left, train_on

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")


class Estimator:
    """A model given by ``model_fn``, trained, evaluated, used and exported as in TF 1.x."""

    def __init__(self, model_fn, model_dir=None, config=None, params=None, warm_start_from=None):
        if config is not None and not isinstance(config, RunConfig):
            raise SpecError(f"config must be a tf.estimator.RunConfig, got {type(config).__name__}")
        config = config or RunConfig()
        if model_dir and config.model_dir and os.path.abspath(model_dir) != config.model_dir:
            raise SpecError(f"model_dir {model_dir} differs from the RunConfig's {config.model_dir}")
        model_dir = model_dir or config.model_dir
        if model_dir is None:
            model_dir = tempfile.mkdtemp()
            log.warning("no model_dir given: using the temporary dir %s", model_dir)
        check_model_fn(model_fn, params)
        # Before model_fn builds any graph: on ps a lookup reads each distinct row once, and a table trained in
        # parts restores by id into one process for evaluate, predict and export (graph/sparse.py).
        install_distinct_lookups()
        self._warm_start_settings = warm_start_lib.settings(warm_start_from)
        self._model_fn = model_fn
        self._config = config.replace(model_dir=model_dir)
        self._params = dict(params) if params is not None else {}

    model_fn = property(lambda self: self._model_fn, doc="The model function.")
    config = property(lambda self: self._config, doc="The RunConfig (with model_dir set).")
    params = property(lambda self: dict(self._params), doc="A copy of the params given to model_fn.")
    model_dir = property(lambda self: self._config.model_dir, doc="Where checkpoints and summaries go.")
    # TF 1.x's add_metrics passes _warm_start_settings on to the Estimator it makes.
    warm_start = property(lambda self: self._warm_start_settings, doc="The WarmStartSettings, or None.")

    def latest_checkpoint(self):
        """The newest checkpoint in model_dir, or None."""
        return tf.train.latest_checkpoint(self.model_dir)

    def get_variable_names(self) -> list:
        """The names of the variables in the latest checkpoint."""
        return [name for name, _ in tf.train.list_variables(self._require_checkpoint())]

    def get_variable_value(self, name):
        """A variable's value in the latest checkpoint."""
        return tf.train.load_variable(self._require_checkpoint(), name)

    def _require_checkpoint(self):
        latest = self.latest_checkpoint()
        if latest is None:
            raise SpecError(f"no checkpoint in {self.model_dir}; train first")
        return latest

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """Train until ``steps`` more steps, global step ``max_steps``, a hook's stop, or the input's end."""
        if steps is not None and max_steps is not None:
            raise SpecError("give train() steps or max_steps, not both")
        whole_number("steps", steps, minimum=1, optional=True)
        whole_number("max_steps", max_steps, minimum=1, optional=True)
        if max_steps is not None and steps_left(self, max_steps) <= 0:
            log.info("skipping training: the latest checkpoint already reaches max_steps %d", max_steps)
            return self
        train_on(self, input_fn, hooks, steps, max_steps, saving_listeners)
        return self

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None) -> dict:
        """Metrics of a checkpoint (the latest by default) over ``input_fn``; ``loss`` and ``global_step`` too."""
        return inference.evaluate(self, input_fn, steps, hooks, checkpoint_path, name)

    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None, yield_single_examples=True):
        """A generator of predictions, one example (or one batch) at a time."""
        return inference.predict(self, input_fn, predict_keys, hooks, checkpoint_path, yield_single_examples)

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None, as_text=False,
                           checkpoint_path=None, experimental_mode=None):
        """A SavedModel for serving in ``<export_dir_base>/<timestamp>``; returns its path (bytes)."""
        if experimental_mode not in (None, "infer"):
            raise SpecError("export_saved_model exports the PREDICT mode only")
        return export_lib.export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra,
                                             as_text, checkpoint_path)

    def export_savedmodel(self, export_dir_base, serving_input_receiver_fn, assets_extra=None, as_text=False,
                          checkpoint_path=None, strip_default_attrs=False):
        """TF 1.x's older name of :meth:`export_saved_model`."""
        return self.export_saved_model(export_dir_base, serving_input_receiver_fn, assets_extra, as_text,
                                       checkpoint_path)

    def eval_dir(self, name=None) -> str:
        """Where evaluate() writes its summaries."""
        return os.path.join(self.model_dir, "eval" if not name else f"eval_{name}")
