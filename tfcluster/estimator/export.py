"""``tf.estimator.export``: SavedModels of an Estimator for serving, and the exporters of ``EvalSpec``.

``Estimator.export_saved_model`` builds ``model_fn``'s PREDICT graph on the
tensors a ``serving_input_receiver_fn`` gives, restores the latest checkpoint
and writes a TF 1.x SavedModel (tag ``serve``, one signature per
``export_outputs`` entry, ``serving_default`` among them) into a new
``<export_dir_base>/<timestamp>`` dir. ``tf.saved_model.load`` serves it in
TF 2 (``loaded.signatures["serving_default"](...)``). The signature building is
TensorFlow's own (``tensorflow.python.saved_model.model_utils``).
"""

import collections
import logging
import os

import tensorflow as tf
from tensorflow.python.saved_model.model_utils import export_output as _outputs
from tensorflow.python.saved_model.model_utils import export_utils as _export_utils
from tensorflow.python.util import deprecation

from ..core.errors import TfclusterError
from ..runtime.checkpoints import checkpoint_exists, checkpoint_step, restore_error
from .calls import call_estimator_model_fn
from .inference import inference_graph
from .spec import ModeKeys

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")

ExportOutput = _outputs.ExportOutput
PredictOutput = _outputs.PredictOutput
ClassificationOutput = _outputs.ClassificationOutput
RegressionOutput = _outputs.RegressionOutput

__all__ = ["ServingInputReceiver", "TensorServingInputReceiver", "build_raw_serving_input_receiver_fn",
           "build_parsing_serving_input_receiver_fn", "ExportOutput", "PredictOutput", "ClassificationOutput",
           "RegressionOutput", "Exporter", "LatestExporter", "FinalExporter", "export_saved_model"]


class ServingInputReceiver(collections.namedtuple(
        "ServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"])):
    """What a serving_input_receiver_fn returns: the model's features and the tensors a client feeds."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if not isinstance(features, dict):
            features = {"feature": features}
        if not isinstance(receiver_tensors, dict):
            receiver_tensors = {"input": receiver_tensors}
        return super().__new__(cls, features, receiver_tensors, receiver_tensors_alternatives)


class TensorServingInputReceiver(collections.namedtuple(
        "TensorServingInputReceiver", ["features", "receiver_tensors", "receiver_tensors_alternatives"])):
    """A receiver whose features are one tensor, passed to model_fn as it is (not in a dict)."""

    def __new__(cls, features, receiver_tensors, receiver_tensors_alternatives=None):
        if not isinstance(receiver_tensors, dict):
            receiver_tensors = {"input": receiver_tensors}
        return super().__new__(cls, features, receiver_tensors, receiver_tensors_alternatives)


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
    """A serving_input_receiver_fn that feeds the features themselves: one placeholder per feature."""
    def serving_input_receiver_fn():
        receivers = {}
        for name, t in (features.items() if isinstance(features, dict) else [("feature", features)]):
            t = tf.convert_to_tensor(t)
            shape = [default_batch_size] + t.shape.as_list()[1:] if t.shape.rank else [default_batch_size]
            receivers[name] = tf1.placeholder(t.dtype, shape=shape, name=name)
        if not isinstance(features, dict):
            return TensorServingInputReceiver(receivers["feature"], receivers)
        return ServingInputReceiver(dict(receivers), receivers)
    return serving_input_receiver_fn


def build_parsing_serving_input_receiver_fn(feature_spec, default_batch_size=None):
    """A serving_input_receiver_fn that parses serialized ``tf.Example`` protos with ``feature_spec``."""
    def serving_input_receiver_fn():
        serialized = tf1.placeholder(tf.string, shape=[default_batch_size], name="input_example_tensor")
        features = tf1.io.parse_example(serialized, feature_spec)
        return ServingInputReceiver(features, {"examples": serialized})
    return serving_input_receiver_fn


def _signatures(spec, receiver):
    outputs = _export_utils.export_outputs_for_mode(ModeKeys.PREDICT, serving_export_outputs=spec.export_outputs,
                                                    predictions=spec.predictions)
    return _export_utils.build_all_signature_defs(receiver.receiver_tensors, outputs,
                                                  receiver.receiver_tensors_alternatives, serving_only=True)


def export_saved_model(estimator, export_dir_base, serving_input_receiver_fn, assets_extra=None,
                       as_text=False, checkpoint_path=None) -> bytes:
    """Write a SavedModel of ``estimator``'s latest (or the given) checkpoint; returns its dir (bytes)."""
    checkpoint = checkpoint_path or estimator.latest_checkpoint()
    if checkpoint is None:
        raise TfclusterError(f"no checkpoint in {estimator.model_dir} to export; train first")
    graph = inference_graph()
    with graph.as_default():
        tf1.train.get_or_create_global_step()
        receiver = serving_input_receiver_fn()
        spec = call_estimator_model_fn(estimator.model_fn, receiver.features, None, ModeKeys.PREDICT,
                                       estimator.params, estimator.config)
        with deprecation.silence():      # TF's signature helpers use its own deprecated functions
            signatures = _signatures(spec, receiver)
        saver = spec.scaffold.saver or tf1.train.Saver()
        export_dir = _export_utils.get_timestamped_export_dir(export_dir_base)
        temp_dir = _export_utils.get_temp_export_dir(export_dir)
        with tf1.Session(config=tf1.ConfigProto(allow_soft_placement=True)) as session:
            try:
                saver.restore(session, checkpoint)
            except (ValueError, tf.errors.NotFoundError) as e:
                if checkpoint_exists(checkpoint):
                    raise
                # The evaluator's exporter runs after its evaluation, by which time a chief that saves often may
                # have rotated the checkpoint away: skipped as a vanished evaluation is (training/checkpoint_watch.py).
                raise restore_error(checkpoint, e) from None
            builder = tf1.saved_model.Builder(temp_dir)
            builder.add_meta_graph_and_variables(
                session, [tf1.saved_model.tag_constants.SERVING], signature_def_map=signatures,
                main_op=tf1.tables_initializer(), strip_default_attrs=True)
            builder.save(as_text)
    for dest, source in (assets_extra or {}).items():
        target = os.path.join(tf.compat.as_str(temp_dir), "assets.extra", dest)
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(source, target, overwrite=True)
    tf.io.gfile.rename(temp_dir, export_dir)
    log.info("exported a SavedModel of %s (global step %s) to %s", os.path.basename(checkpoint),
             checkpoint_step(checkpoint), tf.compat.as_str(export_dir))
    return export_dir


class Exporter:
    """What an EvalSpec runs after each evaluation (TF 1.x's ``tf.estimator.Exporter``)."""

    name = "exporter"

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Export, or not; returns the export dir or None."""
        raise NotImplementedError


class LatestExporter(Exporter):
    """A SavedModel after every evaluation, keeping the ``exports_to_keep`` newest."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False, exports_to_keep=5):
        self.name, self.serving_input_receiver_fn = name, serving_input_receiver_fn
        self.assets_extra, self.as_text, self.exports_to_keep = assets_extra, as_text, exports_to_keep

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Export this checkpoint; remove the oldest exports beyond ``exports_to_keep``."""
        path = export_saved_model(estimator, export_path, self.serving_input_receiver_fn, self.assets_extra,
                                  self.as_text, checkpoint_path)
        if self.exports_to_keep:
            kept = sorted(d for d in tf.io.gfile.listdir(export_path) if d.rstrip("/").isdigit())
            for old in kept[:-self.exports_to_keep]:
                tf.io.gfile.rmtree(os.path.join(export_path, old))
        return path


class FinalExporter(LatestExporter):
    """A SavedModel after the final evaluation only."""

    def __init__(self, name, serving_input_receiver_fn, assets_extra=None, as_text=False):
        super().__init__(name, serving_input_receiver_fn, assets_extra, as_text, exports_to_keep=None)

    def export(self, estimator, export_path, checkpoint_path, eval_result, is_the_final_export):
        """Export only when this is the last evaluation."""
        if not is_the_final_export:
            return None
        return super().export(estimator, export_path, checkpoint_path, eval_result, is_the_final_export)
