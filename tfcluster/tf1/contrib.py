"""``tf.contrib`` in TF1 mode: the commonly used names, mapped to TF 2.21.

tf.contrib was removed in TF 2.0. The names below are the ones TF1
distributed scripts and tutorials use most; each maps to its TF 2.21 graph-mode
equivalent (``tf.compat.v1``), or is re-implemented here where TF 2.21 has no
exact equivalent. Every other name raises :class:`TF1RemovedError`, one line
that names the symbol and what to use instead, never a deep AttributeError.

Nothing here imports TensorFlow at import time; :func:`build` is given
``tf.compat.v1`` once TensorFlow is loaded.
"""

import types

from ..core.errors import TF1RemovedError
from . import distribute

#: Where to look for the TF 2 replacement of a name this module does not map.
MIGRATION_GUIDE = "its TF 2 replacement (https://www.tensorflow.org/guide/migrate; docs/tf1.md)"

_NEEDS_TF_KERAS = ("needs the tf-keras package on TF 2.21 (Keras 3 has no graph-mode layers): "
                   "pip install tf-keras==2.21.0")


# Names TF 2.21 has no mapping for, with the replacement to name in the error.
HINTS = {
    "tf.contrib.slim": "tf.compat.v1.layers (the tf-slim package is not covered by TF1 mode)",
    "tf.contrib.framework.arg_scope": "explicit arguments on each tf.layers call (arg_scope came with slim)",
    "tf.contrib.framework.add_arg_scope": "explicit arguments on each tf.layers call (arg_scope came with slim)",
    "tf.contrib.layers.conv2d": "tf.layers.conv2d(inputs, filters, kernel_size, padding='same', "
                                "activation=tf.nn.relu)",
    "tf.contrib.layers.max_pool2d": "tf.layers.max_pooling2d(inputs, pool_size, strides)",
    "tf.contrib.layers.avg_pool2d": "tf.layers.average_pooling2d(inputs, pool_size, strides)",
    "tf.contrib.layers.batch_norm": "tf.layers.batch_normalization (and run tf.GraphKeys.UPDATE_OPS with the "
                                    "train op)",
    "tf.contrib.layers.dropout": "tf.layers.dropout(inputs, rate=1 - keep_prob, training=...)",
    "tf.contrib.layers.embed_sequence": "tf.nn.embedding_lookup on a tf.get_variable",
    "tf.contrib.layers.optimize_loss": "optimizer.minimize(loss, global_step=...) with tf.train optimizers",
    "tf.contrib.layers.summarize_tensors": "tf.summary.histogram / tf.summary.scalar",
    "tf.contrib.layers.summarize_activation": "tf.summary.histogram",
    "tf.contrib.layers.layer_norm": "tf.keras.layers.LayerNormalization (with tf-keras)",
    "tf.contrib.learn": "tf.estimator (TF1 mode has it: Estimator, train_and_evaluate) or tfcluster.fit",
    "tf.contrib.training.HParams": "a dict, argparse.Namespace or types.SimpleNamespace",
    "tf.contrib.training": "tf.data input pipelines and tf.train hooks",
    "tf.contrib.losses": "tf.losses (note the argument order: labels first, then logits or predictions)",
    "tf.contrib.opt": "the tf.train optimizers (tf.compat.v1.train.*Optimizer)",
    "tf.contrib.seq2seq": "tf.nn.dynamic_rnn with your own decoder (tensorflow-addons is archived)",
    "tf.contrib.distributions": "the tensorflow-probability package",
    "tf.contrib.distribute": "MirroredStrategy, ParameterServerStrategy, CollectiveAllReduceStrategy, "
                             "OneDeviceStrategy or DistributeConfig, which TF1 mode covers (docs/tf1.md)",
    "tf.contrib.tpu": "nothing: TPUs are out of scope for tfcluster",
    "tf.contrib.cudnn_rnn": "tf.nn.rnn_cell.LSTMCell (with tf-keras)",
    "tf.contrib.crf": "the tensorflow-addons CRF code (archived) or your own",
    "tf.contrib.image": "tf.image",
    "tf.contrib.lookup": "tf.lookup",
    "tf.contrib.summary": "tf.summary (tf.compat.v1.summary in graph mode)",
    "tf.contrib.data.parallel_interleave": "tf.data.Dataset.interleave(..., num_parallel_calls=...)",
}


def _hint(symbol: str) -> str:
    parts = symbol.split(".")
    for n in range(len(parts), 1, -1):
        hint = HINTS.get(".".join(parts[:n]))
        if hint:
            return hint
    return MIGRATION_GUIDE


def removed(symbol: str) -> TF1RemovedError:
    """The error for a tf.contrib name TF1 mode does not map."""
    since = "2.16" if symbol.startswith("tf.estimator") else "2.x"
    return TF1RemovedError(symbol, _hint(symbol), since)


class ContribModule(types.ModuleType):
    """A synthetic ``tensorflow.contrib[.x]`` module; unknown names raise TF1RemovedError."""

    def __init__(self, symbol: str, members: dict):
        super().__init__("tensorflow" + symbol[len("tf"):])
        self.__symbol = symbol
        self.__path__ = []  # a package, so that `import tensorflow.contrib.x.y` asks our finder
        self.__dict__.update(members)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        symbol = f"{self.__symbol}.{name}"
        if name in _LAZY.get(self.__symbol, {}):
            value = _LAZY[self.__symbol][name]()
        elif self.__symbol == "tf.contrib":
            # An unmapped contrib module: importing it works, so that the error can
            # name the symbol actually used (tf.contrib.training.HParams, not tf.contrib.training).
            value = ContribModule(symbol, {})
        else:
            raise removed(symbol)
        setattr(self, name, value)
        return value

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(_LAZY.get(self.__symbol, {})))

    def __repr__(self):
        return f"<TF1-mode stand-in for {self.__symbol}>"


# Names resolved on first use, because they need tf-keras (the tf.layers and
# rnn_cell code lives there on TF 2.21) and most scripts never touch them.
_LAZY = {}


# ------------------------------------------------------------------ framework
def _framework(v1):
    return {
        "get_or_create_global_step": v1.train.get_or_create_global_step,
        "get_global_step": v1.train.get_global_step,
        "create_global_step": v1.train.create_global_step,
        "assert_or_get_global_step": _assert_or_get_global_step(v1),
        "get_variables": _get_variables(v1),
        "get_model_variables": v1.model_variables,
        "get_local_variables": lambda scope=None, suffix=None: _get_variables(v1)(
            scope, suffix, v1.GraphKeys.LOCAL_VARIABLES),
        "nest": v1.nest,
    }


def _assert_or_get_global_step(v1):
    def assert_or_get_global_step(graph=None, global_step_tensor=None):
        """The given global step tensor after checking it, else the graph's global step."""
        if global_step_tensor is None:
            global_step_tensor = v1.train.get_global_step(graph)
            if global_step_tensor is None:
                return None
        v1.train.assert_global_step(global_step_tensor)
        return global_step_tensor
    return assert_or_get_global_step


def _get_variables(v1):
    def get_variables(scope=None, suffix=None, collection=None):
        """Variables of a collection (global by default) under ``scope``, ending in ``suffix``."""
        if collection is None:
            collection = v1.GraphKeys.GLOBAL_VARIABLES
        if isinstance(scope, v1.VariableScope):
            scope = scope.name
        if suffix is not None:
            scope = (scope or "") + ".*" + suffix
        return v1.get_collection(collection, scope)
    return get_variables


# --------------------------------------------------------------------- layers
def _variance_scaling(v1, factor, mode, uniform, seed, dtype, who):
    mode = str(mode).upper()
    if mode not in ("FAN_IN", "FAN_OUT", "FAN_AVG"):
        raise TypeError(f"{who}: unknown mode {mode!r}; use FAN_IN, FAN_OUT or FAN_AVG")
    # contrib's normal case drew from a truncated normal of stddev sqrt(1.3*factor/n);
    # TF 2's "truncated_normal" is the same law with the exact truncation constant.
    from tensorflow.python.util import deprecation
    with deprecation.silence():  # TF deprecates dtype= here; contrib took it, so scripts pass it
        return v1.variance_scaling_initializer(scale=factor, mode=mode.lower(),
                                               distribution="uniform" if uniform else "truncated_normal",
                                               seed=seed, dtype=dtype)


def _regularizers(v1):
    import numbers

    def _check(scale, who):
        if isinstance(scale, numbers.Integral):
            raise ValueError(f"{who}: scale cannot be an integer: {scale}")
        if isinstance(scale, numbers.Real):
            if scale < 0.0:
                raise ValueError(f"{who}: setting a scale less than 0 on a regularizer: {scale}")
            return scale != 0.0
        return True

    def l1_regularizer(scale, scope=None):
        """A function weights -> scale * sum(|weights|), as tf.contrib.layers made it."""
        if not _check(scale, "l1_regularizer"):
            return lambda _: None

        def l1(weights):
            with v1.name_scope(scope, "l1_regularizer", [weights]) as name:
                s = v1.convert_to_tensor(scale, dtype=weights.dtype.base_dtype, name="scale")
                return v1.multiply(s, v1.reduce_sum(v1.abs(weights)), name=name)
        return l1

    def l2_regularizer(scale, scope=None):
        """A function weights -> scale * sum(weights**2) / 2, as tf.contrib.layers made it."""
        if not _check(scale, "l2_regularizer"):
            return lambda _: None

        def l2(weights):
            with v1.name_scope(scope, "l2_regularizer", [weights]) as name:
                s = v1.convert_to_tensor(scale, dtype=weights.dtype.base_dtype, name="scale")
                return v1.multiply(s, v1.nn.l2_loss(weights), name=name)
        return l2

    def sum_regularizer(regularizer_list, scope=None):
        """A function that adds the given regularizers' penalties."""
        regularizer_list = [r for r in regularizer_list if r]
        if not regularizer_list:
            return None

        def total(weights):
            with v1.name_scope(scope, "sum_regularizer", [weights]) as name:
                penalties = [p for p in (r(weights) for r in regularizer_list) if p is not None]
                return v1.add_n(penalties, name=name)
        return total

    def l1_l2_regularizer(scale_l1=1.0, scale_l2=1.0, scope=None):
        """The sum of an L1 and an L2 regularizer."""
        if isinstance(scale_l1, float) and scale_l1 == 0.0:
            return l2_regularizer(scale_l2, scope)
        if isinstance(scale_l2, float) and scale_l2 == 0.0:
            return l1_regularizer(scale_l1, scope)
        return sum_regularizer([l1_regularizer(scale_l1), l2_regularizer(scale_l2)], scope=scope)

    def apply_regularization(regularizer, weights_list=None):
        """Sum of ``regularizer`` over the weights (tf.GraphKeys.WEIGHTS by default), added to
        tf.GraphKeys.REGULARIZATION_LOSSES."""
        if not weights_list:
            weights_list = v1.get_collection(v1.GraphKeys.WEIGHTS)
        if not weights_list:
            raise ValueError("No weights to regularize.")
        with v1.name_scope("get_regularization_penalty", values=weights_list) as scope:
            penalties = [p for p in (regularizer(w) for w in weights_list) if p is not None]
            total = v1.add_n(penalties, name=scope) if penalties else v1.constant(0.0)
            v1.add_to_collection(v1.GraphKeys.REGULARIZATION_LOSSES, total)
            return total

    return {"l1_regularizer": l1_regularizer, "l2_regularizer": l2_regularizer,
            "l1_l2_regularizer": l1_l2_regularizer, "sum_regularizer": sum_regularizer,
            "apply_regularization": apply_regularization}


def _layers(v1):
    def xavier_initializer(uniform=True, seed=None, dtype=v1.float32):
        """Glorot initializer (variance scaling, factor 1, fan_avg)."""
        return _variance_scaling(v1, 1.0, "FAN_AVG", uniform, seed, dtype, "xavier_initializer")

    def variance_scaling_initializer(factor=2.0, mode="FAN_IN", uniform=False, seed=None, dtype=v1.float32):
        """He-style initializer with contrib's defaults (factor 2, FAN_IN, truncated normal)."""
        return _variance_scaling(v1, factor, mode, uniform, seed, dtype, "variance_scaling_initializer")

    def flatten(inputs, outputs_collections=None, scope=None):
        """Reshape ``inputs`` to (batch, -1), keeping the static shape where it is known."""
        with v1.name_scope(scope, "Flatten", [inputs]) as name:
            inputs = v1.convert_to_tensor(inputs)
            static = inputs.get_shape()
            if static.ndims is not None and static.ndims < 2:
                raise ValueError(f"Inputs must have at least 2 dimensions, got {static}")
            rest = static[1:].num_elements() if static.ndims is not None else None
            if rest is not None:
                out = v1.reshape(inputs, [-1, rest], name=name)
            else:
                out = v1.reshape(inputs, v1.stack([v1.shape(inputs)[0], -1]), name=name)
            for c in (outputs_collections or []):
                v1.add_to_collection(c, out)
            return out

    regs = _regularizers(v1)

    def fully_connected(inputs, num_outputs, activation_fn=v1.nn.relu, normalizer_fn=None,
                        normalizer_params=None, weights_initializer=None, weights_regularizer=None,
                        biases_initializer=v1.zeros_initializer(), biases_regularizer=None, reuse=None,
                        variables_collections=None, outputs_collections=None, trainable=True, scope=None):
        """tf.layers.dense with contrib's defaults (ReLU, Glorot uniform weights)."""
        if normalizer_fn is not None or normalizer_params or variables_collections:
            raise TF1RemovedError("tf.contrib.layers.fully_connected(normalizer_fn=..., variables_collections=...)",
                                  "tf.layers.dense followed by tf.layers.batch_normalization")
        try:
            dense = v1.layers.dense
        except AttributeError:
            raise TF1RemovedError("tf.contrib.layers.fully_connected without tf-keras",
                                  "tf-keras: pip install tf-keras==2.21.0") from None
        out = dense(inputs, num_outputs, activation=activation_fn,
                    use_bias=biases_initializer is not None,
                    kernel_initializer=weights_initializer or xavier_initializer(),
                    bias_initializer=biases_initializer or v1.zeros_initializer(),
                    kernel_regularizer=weights_regularizer, bias_regularizer=biases_regularizer,
                    trainable=trainable, name=scope or "fully_connected", reuse=reuse)
        for c in (outputs_collections or []):
            v1.add_to_collection(c, out)
        return out

    return dict(regs, xavier_initializer=xavier_initializer, xavier_initializer_conv2d=xavier_initializer,
                variance_scaling_initializer=variance_scaling_initializer, flatten=flatten,
                fully_connected=fully_connected)


# ------------------------------------------------------------------------ rnn
_RNN_CELLS = ("BasicLSTMCell", "BasicRNNCell", "DeviceWrapper", "DropoutWrapper", "GRUCell", "LSTMCell",
              "LSTMStateTuple", "MultiRNNCell", "RNNCell", "ResidualWrapper")


def _rnn_lazy(v1):
    def cell(name):
        def resolve():
            try:
                return getattr(v1.nn.rnn_cell, name)
            except (AttributeError, ImportError):
                raise TF1RemovedError(f"tf.contrib.rnn.{name} without tf-keras",
                                      f"tf.nn.rnn_cell.{name}, which {_NEEDS_TF_KERAS}") from None
        return resolve
    lazy = {n: cell(n) for n in _RNN_CELLS}
    lazy["static_rnn"] = lambda: v1.nn.static_rnn
    lazy["static_bidirectional_rnn"] = lambda: v1.nn.static_bidirectional_rnn
    lazy["static_state_saving_rnn"] = lambda: v1.nn.static_state_saving_rnn
    return lazy


# ----------------------------------------------------------------------- data
def _data(v1):
    def batch_and_drop_remainder(batch_size):
        """A Dataset transformation: batches of exactly ``batch_size``."""
        return lambda ds: ds.batch(batch_size, drop_remainder=True)

    def shuffle_and_repeat(buffer_size, count=None, seed=None):
        """A Dataset transformation: shuffle, then repeat ``count`` times (forever if None)."""
        return lambda ds: ds.shuffle(buffer_size, seed=seed).repeat(count)

    def map_and_batch(map_func, batch_size, num_parallel_batches=None, drop_remainder=False,
                      num_parallel_calls=None):
        """A Dataset transformation: map, then batch."""
        return lambda ds: ds.map(map_func, num_parallel_calls=num_parallel_calls).batch(
            batch_size, drop_remainder=drop_remainder)

    return {"Dataset": v1.data.Dataset, "TFRecordDataset": v1.data.TFRecordDataset,
            "TextLineDataset": v1.data.TextLineDataset,
            "FixedLengthRecordDataset": v1.data.FixedLengthRecordDataset, "Iterator": v1.data.Iterator,
            "batch_and_drop_remainder": batch_and_drop_remainder, "shuffle_and_repeat": shuffle_and_repeat,
            "map_and_batch": map_and_batch}


# -------------------------------------------------------------------- metrics
def _metrics(v1):
    def swapped(fn):
        # contrib's streaming metrics took (predictions, labels); tf.metrics takes (labels, predictions).
        def metric(predictions, labels, weights=None, metrics_collections=None, updates_collections=None,
                   name=None, **kw):
            return fn(labels, predictions, weights=weights, metrics_collections=metrics_collections,
                      updates_collections=updates_collections, name=name, **kw)
        metric.__name__ = "streaming_" + fn.__name__
        metric.__doc__ = f"tf.metrics.{fn.__name__} with contrib's (predictions, labels) argument order."
        return metric

    def streaming_mean(values, weights=None, metrics_collections=None, updates_collections=None, name=None):
        """tf.metrics.mean."""
        return v1.metrics.mean(values, weights, metrics_collections, updates_collections, name)

    out = {"streaming_" + n: swapped(getattr(v1.metrics, n))
           for n in ("accuracy", "precision", "recall", "auc", "mean_absolute_error",
                     "mean_squared_error", "root_mean_squared_error")}
    out["streaming_mean"] = streaming_mean
    return out


# ---------------------------------------------------------------------- build
class _Datasets(dict):
    """``tf.contrib.learn.datasets.DATASETS``: ``'mnist'`` reads local files; the others name what to use."""

    def __init__(self, mnist):
        super().__init__(mnist=mnist.load_mnist)

    def __missing__(self, name):
        raise TF1RemovedError(f"tf.contrib.learn.datasets.DATASETS[{name!r}]",
                              "your own loader (only 'mnist' is covered: it reads the four IDX files from disk)")

    def load(self, name, size="small", test_with_fake_data=False):
        """``load_dataset(name)``: the data set of that name."""
        return self[name]()


def build(v1, read_data_sets_module) -> ContribModule:
    """The ``tf.contrib`` stand-in for a loaded ``tf.compat.v1``."""
    mnist = read_data_sets_module
    datasets = ContribModule("tf.contrib.learn.datasets", {"mnist": mnist, "DATASETS": _Datasets(mnist),
                                                           "load_dataset": _Datasets(mnist).load})
    learn_python = ContribModule("tf.contrib.learn.python", {
        "learn": ContribModule("tf.contrib.learn.python.learn", {
            "datasets": ContribModule("tf.contrib.learn.python.learn.datasets", {"mnist": mnist})})})
    _LAZY["tf.contrib.rnn"] = _rnn_lazy(v1)
    subs = {
        "framework": ContribModule("tf.contrib.framework", _framework(v1)),
        "layers": ContribModule("tf.contrib.layers", _layers(v1)),
        "learn": ContribModule("tf.contrib.learn", {"datasets": datasets, "python": learn_python}),
        "rnn": ContribModule("tf.contrib.rnn", {}),
        "data": ContribModule("tf.contrib.data", _data(v1)),
        "metrics": ContribModule("tf.contrib.metrics", _metrics(v1)),
        "distribute": ContribModule("tf.contrib.distribute", distribute.members()),
    }
    root = ContribModule("tf.contrib", subs)
    _LAZY["tf.contrib"] = {"keras": lambda: v1.keras}
    return root
