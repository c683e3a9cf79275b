"""``tf.estimator.inputs``: input functions over in-memory arrays, as TF 1.x had them.

``numpy_input_fn`` reads through ``tf.data`` instead of TF 1.x's queue
runners, with the same arguments and batches: features as a dict (or one
tensor), labels, ``num_epochs`` passes (None: forever), shuffled on request,
the last batch smaller. As in TF 1.x it does not shard: every worker reads all
of the data, each in its own shuffled order.
"""

import numpy as np
import tensorflow as tf

from ..core.errors import SpecError, TF1RemovedError


def _as_arrays(value, what):
    if isinstance(value, dict):
        if not value:
            raise SpecError(f"numpy_input_fn: {what} is an empty dict")
        return {k: np.asarray(v) for k, v in value.items()}
    return np.asarray(value)


def _length(value):
    return len(next(iter(value.values()))) if isinstance(value, dict) else len(value)


def numpy_input_fn(x, y=None, batch_size=128, num_epochs=1, shuffle=None, queue_capacity=1000, num_threads=1):
    """An input_fn giving ``(features, labels)`` batches of numpy ``x`` (an array or a dict) and ``y``."""
    if shuffle is None or not isinstance(shuffle, bool):
        raise SpecError(f"numpy_input_fn: shuffle must be True or False, got {shuffle!r} (TF 1.x made you choose)")
    if batch_size is None or batch_size <= 0:
        raise SpecError(f"numpy_input_fn: batch_size must be > 0, got {batch_size!r}")
    if num_epochs is not None and num_epochs <= 0:
        raise SpecError(f"numpy_input_fn: num_epochs must be > 0 or None, got {num_epochs!r}")
    features = _as_arrays(x, "x")
    labels = None if y is None else _as_arrays(y, "y")
    n = _length(features)
    sizes = [len(v) for v in (features.values() if isinstance(features, dict) else [features])]
    if labels is not None:
        sizes += [len(v) for v in (labels.values() if isinstance(labels, dict) else [labels])]
    if len(set(sizes)) > 1:
        raise SpecError(f"numpy_input_fn: x and y must have the same length, got lengths {sorted(set(sizes))}")

    def input_fn():
        data = features if labels is None else (features, labels)
        ds = tf.data.Dataset.from_tensor_slices(data)
        if shuffle:
            ds = ds.shuffle(max(queue_capacity, 1))
        ds = ds.repeat(num_epochs)
        return ds.batch(batch_size).prefetch(max(1, num_threads))
    input_fn.examples = n
    return input_fn


def pandas_input_fn(*args, **kwargs):
    """Not covered: tfcluster does not depend on pandas."""
    raise TF1RemovedError("tf.estimator.inputs.pandas_input_fn",
                          "numpy_input_fn(x={name: frame[name].values ...}, y=frame[label].values)")
