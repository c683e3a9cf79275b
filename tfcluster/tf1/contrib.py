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
from ..estimator import canned
from ..graph.lazy_adam import lazy_adam_optimizer
from . import distribute, slim

#: Where to look for the TF 2 replacement of a name this module does not map.
MIGRATION_GUIDE = "its TF 2 replacement (https://www.tensorflow.org/guide/migrate; docs/tf1.md)"

_NEEDS_TF_KERAS = ("needs the tf-keras package on TF 2.21 (Keras 3 has no graph-mode layers): "
                   "pip install tf-keras==2.21.0")


# Names TF 2.21 has no mapping for, with the replacement to name in the error.
HINTS = {
    "tf.contrib.layers.embed_sequence": "tf.nn.embedding_lookup on a tf.get_variable",
    "tf.contrib.layers.real_valued_column": "tf.feature_column.numeric_column",
    "tf.contrib.layers.sparse_column_with_hash_bucket": "tf.feature_column.categorical_column_with_hash_bucket",
    "tf.contrib.layers.sparse_column_with_keys": "tf.feature_column.categorical_column_with_vocabulary_list",
    "tf.contrib.layers.embedding_column": "tf.feature_column.embedding_column",
    "tf.contrib.layers.one_hot_column": "tf.feature_column.indicator_column",
    "tf.contrib.layers.crossed_column": "tf.feature_column.crossed_column",
    "tf.contrib.layers.bucketized_column": "tf.feature_column.bucketized_column",
    "tf.contrib.layers.input_from_feature_columns": "tf.feature_column.input_layer",
    "tf.contrib.layers.weighted_sum_from_feature_columns": "tf.feature_column.linear_model",
    "tf.contrib.learn": "tf.estimator (TF1 mode has it: Estimator, train_and_evaluate) or tfcluster.fit",
    "tf.contrib.training.HParams": "a dict, argparse.Namespace or types.SimpleNamespace",
    "tf.contrib.training": "tf.data input pipelines and tf.train hooks",
    "tf.contrib.opt": "the tf.train optimizers (tf.compat.v1.train.*Optimizer); LazyAdamOptimizer is covered",
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
        elif self.__symbol in slim.SOURCES and symbol not in HINTS:
            try:
                value = slim.member(self.__symbol, name)
            except AttributeError:
                raise removed(symbol) from None
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
    # The global step and checkpoint readers need no tf-slim; the rest of tf.contrib.framework comes from it.
    return {
        "get_or_create_global_step": v1.train.get_or_create_global_step,
        "get_global_step": v1.train.get_global_step,
        "create_global_step": v1.train.create_global_step,
        "assert_global_step": v1.train.assert_global_step,
        "list_variables": v1.train.list_variables,
        "load_variable": v1.train.load_variable,
        "load_checkpoint": v1.train.load_checkpoint,
        "init_from_checkpoint": v1.train.init_from_checkpoint,
        "nest": v1.nest,
    }


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
    _LAZY["tf.contrib.opt"] = {"LazyAdamOptimizer": lazy_adam_optimizer}
    subs = {
        "framework": ContribModule("tf.contrib.framework", _framework(v1)),
        "layers": ContribModule("tf.contrib.layers", {}),        # every name from tf-slim (slim.py)
        "training": ContribModule("tf.contrib.training", {}),
        "losses": ContribModule("tf.contrib.losses", {}),
        "learn": ContribModule("tf.contrib.learn", {"datasets": datasets, "python": learn_python}),
        "rnn": ContribModule("tf.contrib.rnn", {}),
        "data": ContribModule("tf.contrib.data", _data(v1)),
        "metrics": ContribModule("tf.contrib.metrics", _metrics(v1)),
        "distribute": ContribModule("tf.contrib.distribute", distribute.members()),
        # TF 1.x's v1 heads, for DNNEstimator and kin (tensorflow-estimator's, estimator/canned.py).
        "estimator": ContribModule("tf.contrib.estimator", dict(canned.CONTRIB_HEADS)),
        "opt": ContribModule("tf.contrib.opt", {}),
    }
    root = ContribModule("tf.contrib", subs)
    _LAZY["tf.contrib"] = {"keras": lambda: v1.keras, "slim": slim.module}
    return root
