"""``warm_start_from``: a new model's variables initialised from another run's checkpoint, as TF 1.x's Estimator did.

TF 1.x applied the settings (``tf.compat.v1.train.warm_start``, still in TF
2.21) while building the training graph: each variable chosen gets the
checkpoint's value as its initializer. A checkpoint in ``model_dir`` still
wins, since restoring skips initializers, so a restarted run continues from
its own checkpoint, not the warm start's.
"""

import collections
import os

import tensorflow as tf

from ..core.errors import SpecError

tf1 = tf.compat.v1

#: TF 1.x's ``tf.estimator.VocabInfo``: how a vocabulary-backed variable's rows map between two vocabularies.
VocabInfo = tf1.train.VocabInfo


class WarmStartSettings(collections.namedtuple("WarmStartSettings", [
        "ckpt_to_initialize_from", "vars_to_warm_start", "var_name_to_vocab_info", "var_name_to_prev_var_name"])):
    """Which variables to take from which checkpoint (TF 1.x's ``tf.estimator.WarmStartSettings``)."""

    def __new__(cls, ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_vocab_info=None,
                var_name_to_prev_var_name=None):
        if not ckpt_to_initialize_from:
            raise SpecError("WarmStartSettings: ckpt_to_initialize_from must name a checkpoint, a directory or a "
                            "SavedModel")
        return super().__new__(cls, ckpt_to_initialize_from, vars_to_warm_start, var_name_to_vocab_info or {},
                               var_name_to_prev_var_name or {})


def settings(warm_start_from):
    """``warm_start_from`` (None, a path, a SavedModel directory or settings) as :class:`WarmStartSettings`."""
    if warm_start_from is None:
        return None
    if isinstance(warm_start_from, bytes):
        warm_start_from = warm_start_from.decode()
    if isinstance(warm_start_from, (str, os.PathLike)):
        path = os.fspath(warm_start_from)
        variables = os.path.join(path, "variables", "variables")
        if tf.io.gfile.exists(variables + ".index"):      # a SavedModel: its variables (TF 1.x did the same)
            path = variables
        return WarmStartSettings(path)
    if isinstance(warm_start_from, tuple) and hasattr(warm_start_from, "ckpt_to_initialize_from"):
        return WarmStartSettings(*warm_start_from)      # tensorflow-estimator's own settings too
    raise SpecError(f"warm_start_from must be a checkpoint path or a tf.estimator.WarmStartSettings, got "
                    f"{type(warm_start_from).__name__}")


def apply(warm_start: WarmStartSettings) -> None:
    """Give the chosen variables of the default graph the checkpoint's values as initializers."""
    try:
        tf1.train.warm_start(warm_start.ckpt_to_initialize_from, warm_start.vars_to_warm_start,
                             warm_start.var_name_to_vocab_info, warm_start.var_name_to_prev_var_name)
    except (ValueError, tf.errors.NotFoundError) as e:
        raise SpecError(f"warm_start_from {warm_start.ckpt_to_initialize_from}: {str(e).splitlines()[0]}") from None
