"""How input becomes each worker's pipeline: big numpy arrays stay out of the graph, no autotune thread.

An input function that makes a dataset from numpy arrays puts them in the
graph; :func:`arrays_outside_the_graph` keeps the big ones out (a start-up
cost, P5 in scripts/bench.py). Every pipeline tfcluster reads runs without
tf.data's autotune thread (:func:`without_autotune_thread`), which held a
finished trainer's exit for up to a minute (P6).
"""

import contextlib

import numpy as np

from ..core import patches

# ------------------------------------------------------------------ arrays kept out of the graph
#: A numpy array at least this big, given to ``from_tensor_slices`` or ``from_tensors``, stays out of the graph.
OUTSIDE_GRAPH_BYTES = 1 << 20


@contextlib.contextmanager
def arrays_outside_the_graph(min_bytes: int = OUTSIDE_GRAPH_BYTES):
    """While this is on, numpy arrays of ``min_bytes`` or more that make a dataset are read at run time.

    ``tf.data.Dataset.from_tensor_slices(array)`` puts the array in the graph
    as a constant, and TensorFlow's graph optimizer copies the whole graph each
    time a session runs a new set of ops. With the bench's 25 MB array, a
    worker's iterator initialisation took 1-2 s, and each of the five other
    runs before its first step 0.1-0.3 s more (the P5 start-up figure of
    scripts/bench.py); TF's own guide says to keep such arrays out of the graph.
    Here each one is returned by a ``numpy_function`` (stateful, so it is never
    folded back into a constant) when the iterator is initialised, in this
    process: the input pipeline runs where the process that built it runs.
    Only the outer graph's numeric arrays in tuples and dicts are kept out; the
    dataset is the same.
    """
    # Another TensorFlow's layout (tfguard warns about the version) lacks the targets: left alone there.
    with patches.applied("data.slices_outside", min_bytes), patches.applied("data.tensors_outside", min_bytes):
        yield


def _outside(make, min_bytes):
    def wrapper(tensors, name=None):
        return make(_lift(tensors, min_bytes), name)
    return wrapper


def _lift(value, min_bytes):
    """``value`` with each big numeric array (in tuples and dicts) replaced by a tensor read at run time."""
    import tensorflow as tf
    if isinstance(value, np.ndarray):
        if value.nbytes < min_bytes or value.dtype.kind not in "biufc" \
                or tf.compat.v1.get_default_graph().building_function:
            return value
        out = tf.numpy_function(lambda: value, [], tf.as_dtype(value.dtype), stateful=True,
                                name="array_outside_the_graph")
        out.set_shape(value.shape)
        return out
    if isinstance(value, tuple):
        items = [_lift(v, min_bytes) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return type(value)((k, _lift(v, min_bytes)) for k, v in value.items())
    return value


# ------------------------------------------------------------------ tf.data's autotune thread
def without_autotune_thread(dataset):
    """``dataset`` without tf.data's autotune thread, unless the program set autotune itself.

    The thread (tf.data's ``Model::OptimizeLoop``) sleeps between rounds for
    a period that doubles up to 60 s, and an iterator that goes away waits for
    it: a finished trainer's ``session.close()`` took 11.6-24 s in 3 of 10
    runs. Without it, the pipeline's AUTOTUNE buffers and parallelism keep
    their starting values, which cost no throughput on tfcluster's pipelines
    (``python scripts/bench.py --rows tfcluster_async,tfcluster_async_autotune``
    measures both). A program that set ``options.autotune.enabled`` keeps its
    choice.
    """
    import warnings

    import tensorflow as tf
    with warnings.catch_warnings():
        # In graph mode TF warns that options() gives what with_options set in this program, which is what
        # is asked here: the program's own choice.
        warnings.simplefilter("ignore", UserWarning)
        chosen = dataset.options()._to_proto().autotune_options.HasField("enabled")
    if chosen:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


patches.register(patches.Patch(
    "data.slices_outside", "tensorflow.python.data.ops.from_tensor_slices_op:_from_tensor_slices",
    "a dataset's big numpy arrays are fed in when its iterator starts, not folded into the graph (2 GB limit)",
    _outside, "fit's model build, for its length", params=("tensors", "name"),
    optional=True))
patches.register(patches.Patch(
    "data.tensors_outside", "tensorflow.python.data.ops.from_tensors_op:_from_tensors",
    "as above, for Dataset.from_tensors", _outside, "fit's model build, for its length",
    params=("tensors", "name"), optional=True))
