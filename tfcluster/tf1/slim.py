"""``tf.contrib.slim``, and the ``tf.contrib`` names slim brought, from the tf-slim package.

tf-slim (``pip install tf-slim``, in tfcluster's ``legacy`` extra) is TF 1.x's
``tf.contrib.slim`` taken out of TensorFlow and kept working on TF 2.x in graph
mode: its layers, ``arg_scope``, variables helpers, ``learning.train``,
``evaluation`` and ``nets``, and the parts of ``tf.contrib.layers``,
``tf.contrib.framework`` and ``tf.contrib.training`` that lived beside it.
TF1 mode serves those names from it, so TF 1.x's behaviour (contrib's layer
defaults, variable names such as ``fully_connected/weights``, checkpoints) is
TF 1.x's own code, not a re-implementation. Without tf-slim, each such name
fails in one line naming the extra.

tf-slim 1.1.0 (2020) names TensorFlow internals that TF 2.16 moved
(``ops.Tensor``, ``array_ops.stack``, ``control_flow_ops.cond``...), and TF
2.21's ``tensorflow.python.layers.normalization`` loads a tf-keras module by a
path tf-keras 2.21 no longer has. :func:`restore_moved_names` puts each name
back where TF 1.x code looks for it, as an alias of TF's own current object
(:data:`MOVED`), which also serves TF 1.x code that imports those internals
itself. tf-slim must be imported after TensorFlow, which TF1 mode always has.
"""

import importlib
import types

from ..core.errors import MissingSlimError, TF1RemovedError

#: The package and the extra that installs it.
PACKAGE, EXTRA = "tf-slim", "pip install 'tfcluster[legacy]'"

#: TF 1.x module paths that tf-slim holds under another name (the longest prefix wins).
PATHS = {
    "tensorflow.contrib.slim": "tf_slim",
    # TF 1.x's inner packages (``...slim.python.slim``); each ``python`` level is its child's package too.
    "tensorflow.contrib.slim.python": "tf_slim",
    "tensorflow.contrib.slim.python.slim": "tf_slim",
    "tensorflow.contrib.layers.python": "tf_slim.layers",
    "tensorflow.contrib.layers.python.layers": "tf_slim.layers",
    "tensorflow.contrib.framework.python": "tf_slim.ops",
    "tensorflow.contrib.framework.python.ops": "tf_slim.ops",
    "tensorflow.contrib.training.python": "tf_slim.training",
    "tensorflow.contrib.training.python.training": "tf_slim.training",
}

#: ``(module, name, where TF 2.21 keeps it)``: the TF internals tf-slim 1.1.0 names that TF 2.16 moved.
MOVED = (
    ("tensorflow.python.framework.ops", "Tensor", "tensorflow.python.framework.tensor"),
    ("tensorflow.python.framework.ops", "IndexedSlices", "tensorflow.python.framework.indexed_slices"),
    ("tensorflow.python.ops.array_ops", "stack", "tensorflow.python.ops.array_ops_stack"),
    ("tensorflow.python.ops.array_ops", "unstack", "tensorflow.python.ops.array_ops_stack"),
    ("tensorflow.python.ops.control_flow_ops", "cond", "tensorflow.python.ops.cond"),
    ("tensorflow.python.ops.control_flow_ops", "case", "tensorflow.python.ops.control_flow_case"),
    ("tensorflow.python.ops.control_flow_ops", "Assert", "tensorflow.python.ops.control_flow_assert"),
    ("tensorflow.python.ops.control_flow_ops", "while_loop", "tensorflow.python.ops.while_loop"),
    # TF 1.x's variable_scope.variable(...) made a tf.compat.v1.Variable
    ("tensorflow.python.ops.variable_scope", "variable", "tensorflow.python.ops.variable_v1:VariableV1"),
)
#: TF 2.21's tf.layers batch normalization, which it looks for at a path tf-keras 2.21 moved (under ``src``).
NORMALIZATION = ("tensorflow.python.layers.normalization", "tf_keras.src.legacy_tf_layers.normalization")

#: Where each ``tf.contrib`` module's slim-provided names live in tf-slim.
SOURCES = {
    "tf.contrib.layers": ("tf_slim.layers",),
    "tf.contrib.framework": ("tf_slim.ops.arg_scope", "tf_slim.ops.variables"),
    "tf.contrib.training": ("tf_slim.training.training", "tf_slim.training.evaluation"),
    "tf.contrib.losses": ("tf_slim.losses",),
}


def _import(module: str, symbol: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == "tf_slim":
            raise MissingSlimError(symbol, PACKAGE, EXTRA) from None
        if e.name == module:
            raise TF1RemovedError(symbol, f"what the {PACKAGE} package has instead (it has no {module})") from None
        raise


def restore_moved_names():
    """Give TF's internal modules back the names of :data:`MOVED` (where they lack them), and TF's tf.layers
    batch normalization its tf-keras module; call once TensorFlow is imported."""
    for module_name, name, home in MOVED:
        target = importlib.import_module(module_name)
        if name not in vars(target):
            home, _, attr = home.partition(":")
            setattr(target, name, getattr(importlib.import_module(home), attr or name))
    layers, keras_module = NORMALIZATION
    try:
        setattr(importlib.import_module(layers), "normalization", importlib.import_module(keras_module))
    except ImportError:
        pass        # no tf-keras: tf.layers' batch normalization says so itself (tf1/__main__.py)


def module(symbol: str = "tf.contrib.slim"):
    """The ``tf_slim`` package (``tf.contrib.slim``); :class:`MissingSlimError` without it."""
    return _import("tf_slim", symbol)


def tf_slim_name(fullname: str):
    """The tf-slim module a TF 1.x path means (``tensorflow.contrib.slim.nets`` → ``tf_slim.nets``), or None."""
    for prefix in sorted(PATHS, key=len, reverse=True):
        if fullname == prefix or fullname.startswith(prefix + "."):
            return PATHS[prefix] + fullname[len(prefix):]
    return None


def import_module(fullname: str):
    """The tf-slim module for a TF 1.x path that :func:`tf_slim_name` maps; :class:`MissingSlimError` without it."""
    module("tf" + fullname[len("tensorflow"):])
    return _import(tf_slim_name(fullname), "tf" + fullname[len("tensorflow"):])


def member(contrib: str, name: str):
    """``tf.contrib.<x>.<name>`` from tf-slim; AttributeError when tf-slim has no such name.

    Without tf-slim: :class:`MissingSlimError`.
    """
    symbol = f"{contrib}.{name}"
    module(symbol)
    for source in SOURCES.get(contrib, ()):
        value = getattr(_import(source, symbol), name, None)
        if value is not None and not isinstance(value, types.ModuleType):
            return value
    raise AttributeError(symbol)
