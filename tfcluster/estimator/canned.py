"""TF 1.x's canned estimators, heads and their helpers: tensorflow-estimator's own code, on tfcluster's Estimator.

TensorFlow removed ``tf.estimator`` in 2.16, and its last package,
tensorflow-estimator 2.15, no longer imports on TF 2.21: its top-level
``__init__`` builds the whole API, the TPU estimator included, from TF
internals that are gone. The canned estimators themselves (DNN, linear,
wide & deep, baseline), their heads, feature-column code, parsing specs and
exporters are plain graph-mode TF 1.x and still build. This module loads just
those modules, with two stand-ins and one substitution (:func:`package`):

- its ``estimator_export`` decorator registers names in TF's API tables, which
  no longer know the ``estimator`` API: here it returns what it decorates;
- ``tensorflow.python.distribute.estimator_training`` (the distribute
  coordinator its own ``Estimator.train`` used) is gone: an empty module
  stands in, and nothing loaded here calls it;
- its ``estimator.Estimator`` and ``EstimatorV2`` are tfcluster's
  (:class:`CannedEstimator`), set before the canned modules are imported, so
  their v1 classes (TF 1.x's ``tf.estimator.DNNClassifier`` and kin, with
  v1's defaults, such as ``loss_reduction=SUM``), and the v2 forms a v2 head
  needs, subclass it and train on tfcluster's cluster,
  session, placement and recovery, with TF 1.x's own model functions, variable
  names (old model directories restore), metrics, prediction keys and export
  signatures.

Their layers are tf-keras's: while they import, ``tensorflow`` is TF 2.21's
own with tf-keras as its ``keras`` (:func:`_tensorflow_with_tf_keras`), in
TF1 mode or not. tests/test_canned.py and tests/test_canned_checkpoints.py
hold this to TF 1.x's behaviour; docs/estimator.md says what is covered.
"""

import contextlib
import importlib
import importlib.util
import sys
import types

from ..core.errors import SpecError
from ..core.tferrors import hint
from . import warm_start
from .estimator import Estimator

#: The version whose internals this module knows (pip install 'tfcluster[legacy]').
PACKAGE = "tensorflow-estimator==2.15.0"
#: The package of tensorflow-estimator's estimator modules.
ROOT = "tensorflow_estimator.python.estimator"

#: Each name TF 1.x's ``tf.estimator`` had, and the module of tensorflow-estimator that holds its v1 form.
NAMES = {
    **dict.fromkeys(["DNNClassifier", "DNNRegressor", "DNNEstimator"], "canned.dnn"),
    **dict.fromkeys(["LinearClassifier", "LinearRegressor", "LinearEstimator"], "canned.linear"),
    **dict.fromkeys(["DNNLinearCombinedClassifier", "DNNLinearCombinedRegressor", "DNNLinearCombinedEstimator"],
                    "canned.dnn_linear_combined"),
    **dict.fromkeys(["BaselineClassifier", "BaselineRegressor", "BaselineEstimator"], "canned.baseline"),
    "BinaryClassHead": "head.binary_class_head", "MultiClassHead": "head.multi_class_head",
    "MultiLabelHead": "head.multi_label_head", "RegressionHead": "head.regression_head",
    "PoissonRegressionHead": "head.regression_head", "LogisticRegressionHead": "head.regression_head",
    "MultiHead": "head.multi_head", "Head": "head.base_head",
    "add_metrics": "extenders",
    "classifier_parse_example_spec": "canned.parsing_utils", "regressor_parse_example_spec": "canned.parsing_utils",
    "BestExporter": "exporter",
    "pandas_input_fn": "inputs.pandas_io",
}
#: The names of TF 1.x's ``tf.estimator.experimental`` that are covered: the early-stopping hooks.
EXPERIMENTAL = dict.fromkeys(["make_early_stopping_hook", "stop_if_higher_hook", "stop_if_lower_hook",
                              "stop_if_no_increase_hook", "stop_if_no_decrease_hook"], "early_stopping")

_loaded = {}
#: The classes a program hands the Estimator (``RunConfig``, ``TrainSpec``...), tfcluster's, by name: set by the
#: package's ``__init__``, which holds them all; every module of tensorflow-estimator that has one gets it.
PUBLIC = {}


def _publish():
    """Each loaded module of tensorflow-estimator holds tfcluster's :data:`PUBLIC` classes under their names."""
    for name, loaded in list(sys.modules.items()):
        if loaded is not None and name.startswith(ROOT + "."):
            for attr, obj in PUBLIC.items():
                if attr in vars(loaded):
                    setattr(loaded, attr, obj)


def _stand_ins():
    """The two modules tensorflow-estimator needs that TF 2.21 no longer has a use for (see the module doc)."""

    class estimator_export:             # noqa: N801 (its name in tensorflow-estimator)
        """tensorflow-estimator's API-export decorator, doing nothing: TF 2.21 has no ``estimator`` API table."""

        def __init__(self, *names, v1=None):
            pass

        def __call__(self, symbol):
            return symbol

        def export_constant(self, module_name, name):
            """Nothing to register."""

    export = types.ModuleType(f"{ROOT}.estimator_export")
    export.estimator_export = estimator_export
    sys.modules[export.__name__] = export
    import tensorflow.python.distribute as distribute
    if not hasattr(distribute, "estimator_training"):
        coordinator = types.ModuleType("tensorflow.python.distribute.estimator_training")
        sys.modules[coordinator.__name__] = coordinator
        distribute.estimator_training = coordinator


class _Overlay(types.ModuleType):
    """A module that is ``base`` but for the attributes given."""

    def __init__(self, name: str, base, **attributes):
        super().__init__(name, getattr(base, "__doc__", None))
        self.__dict__.update(attributes, _base=base)

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)


@contextlib.contextmanager
def _tensorflow_with_tf_keras():
    """While tensorflow-estimator's modules import, ``import tensorflow`` gives TF 2.21's API (not TF1 mode's
    stand-in) with tf-keras as ``keras`` (v1's and v2's), as TF 1.x's graph-mode ``tf.keras`` was; the modules keep
    that as their ``tf``. Under Keras 3 their models (``tf.keras.Model`` subclasses) could not build in a graph."""
    try:
        import tf_keras
        import tf_keras.api._v1.keras as tf_keras_v1     # what TF's own tf.compat.v1.keras loads under tf-keras
    except ImportError:
        raise SpecError("TF 1.x's canned estimators build graph-mode tf.keras layers, from the tf-keras package, "
                        "which is not installed: pip install 'tfcluster[tensorflow,legacy]'") from None
    api = importlib.import_module("tensorflow._api.v2.compat.v2")      # TF 2.21's tf, whatever sys.modules holds
    compat = _Overlay("tensorflow.compat", api.compat,
                      v1=_Overlay("tensorflow.compat.v1", api.compat.v1, keras=tf_keras_v1),
                      v2=_Overlay("tensorflow.compat.v2", api, keras=tf_keras))
    outer = sys.modules["tensorflow"]
    sys.modules["tensorflow"] = _Overlay("tensorflow", api, keras=tf_keras, compat=compat)
    try:
        yield
    finally:
        sys.modules["tensorflow"] = outer


def package(own_estimator: bool = False):
    """tensorflow-estimator's estimator package, loaded as the module doc says (once per process).

    ``own_estimator``: keep its own ``Estimator`` under the canned classes
    (scripts/canned_reference.py: TF 1.x's estimator as it trained in one
    process, the reference tfcluster's is compared with).
    """
    if "estimator" in _loaded:
        if _loaded["own"] != own_estimator:
            raise SpecError("tensorflow-estimator is loaded once per process, with one Estimator under its classes")
        return _loaded["estimator"]
    spec = importlib.util.find_spec("tensorflow_estimator")
    if spec is None or not spec.submodule_search_locations:
        raise SpecError(f"TF 1.x's canned estimators come from the {PACKAGE} package, which is not installed: "
                        "pip install 'tfcluster[tensorflow,legacy]' (docs/estimator.md)")
    # Its own __init__ (the whole TF 1.x API, TPU included) is skipped: the package is only a path to import from.
    top = sys.modules.get("tensorflow_estimator")
    if top is None or getattr(top, "__file__", None):
        top = types.ModuleType("tensorflow_estimator")
        top.__path__ = list(spec.submodule_search_locations)
        sys.modules["tensorflow_estimator"] = top
    _stand_ins()
    with _tensorflow_with_tf_keras():
        lib = importlib.import_module(f"{ROOT}.estimator")
        # Before any canned module is imported: their classes subclass tfcluster's Estimator.
        if not own_estimator:
            lib.Estimator = lib.EstimatorV2 = CannedEstimator
            lib.WarmStartSettings = warm_start.WarmStartSettings
        for module in sorted(set(NAMES.values()) | set(EXPERIMENTAL.values())):
            importlib.import_module(f"{ROOT}.{module}")
        if not own_estimator:       # its hooks take any Estimator, a model_fn of the user's included
            sys.modules[f"{ROOT}.early_stopping"].estimator_lib = types.SimpleNamespace(Estimator=Estimator)
            _publish()
    _loaded.update(estimator=lib, own=own_estimator)
    return lib


def _ready():
    """The package loaded (with whichever Estimator this process chose)."""
    return package(_loaded.get("own", False))


def submodule(name: str):
    """tensorflow-estimator's module ``name`` (a dotted path under ``tensorflow_estimator``), loaded as the canned
    ones are: once :func:`package` set it up, with TF 2.21's API and tf-keras as its ``tensorflow``."""
    _ready()
    with _tensorflow_with_tf_keras():
        loaded = importlib.import_module(name)
    if not _loaded["own"]:
        _publish()
    return loaded


def _said(what: str, error: Exception) -> SpecError:
    """TF's own ValueError about a column or an argument (it names them and the fix), as one line."""
    text = " ".join(str(getattr(error, "message", None) or error).split())
    return SpecError(f"{what}: {text}{hint(text)}")


class CannedEstimator(Estimator):
    """tfcluster's Estimator as the base of TF 1.x's canned classes: the ValueError and TypeError their model_fn
    raises (a categorical column given to a DNN, an unknown optimizer name) is one line naming it, not a
    traceback."""

    def __init__(self, model_fn, model_dir=None, config=None, params=None, warm_start_from=None):
        name = type(self).__name__

        import tensorflow as tf
        # InvalidArgumentError: a check on constant labels fails while the graph is built (in a step otherwise).
        wrong = (ValueError, TypeError, tf.errors.InvalidArgumentError)

        def canned_model_fn(features, labels, mode, config):
            try:
                return model_fn(features=features, labels=labels, mode=mode, config=config)
            except wrong as e:
                raise _said(f"tf.estimator.{name}", e) from None
        super().__init__(canned_model_fn, model_dir, config, params, warm_start_from)


def _one_line(cls, name: str):
    """``cls`` whose construction says TF's ValueError (say, ``n_classes=1``) in one line."""
    if not isinstance(cls, type) or not issubclass(cls, Estimator):
        return cls

    def __init__(self, *args, **kwargs):
        try:
            cls.__init__(self, *args, **kwargs)
        except (ValueError, TypeError) as e:
            raise _said(f"tf.estimator.{name}", e) from None
    return type(name, (cls,), {"__init__": __init__, "__doc__": cls.__doc__, "__module__": cls.__module__})


def get(name: str):
    """TF 1.x's ``tf.estimator.<name>`` from tensorflow-estimator (v1 form), on tfcluster's Estimator."""
    if name not in NAMES and name not in EXPERIMENTAL:
        raise AttributeError(name)
    _ready()
    module = importlib.import_module(f"{ROOT}.{NAMES.get(name) or EXPERIMENTAL[name]}")
    if name == "pandas_input_fn":
        return _pandas_input_fn(module.pandas_input_fn) if getattr(module, "HAS_PANDAS", False) else _without_pandas
    if name not in _loaded:         # one class object per name, as an import gives
        made = _one_line(getattr(module, name), name)
        if name in _BY_HEAD:
            v2 = _one_line(getattr(module, name + "V2"), name) if name != "BaselineEstimator" else _baseline_v2
            made = _by_head(made, v2)
        _loaded[name] = made
    return _loaded[name]


#: The classes that take a head: TF 1.x's v1 form for a v1 head, the v2 form for a v2 one (``BinaryClassHead``...).
_BY_HEAD = {"DNNEstimator", "LinearEstimator", "DNNLinearCombinedEstimator", "BaselineEstimator"}


def _baseline_v2(head, *args, **kwargs):
    # Its v2 form makes its bias under control dependencies on the first batch's size checks, so initialising it
    # reads the input, which tfcluster's resumable input pipeline gives only after initialisation.
    raise SpecError(f"tf.estimator.BaselineEstimator with a v2 head ({type(head).__name__}) is not covered yet; give "
                    "it tf.contrib.estimator's head of that kind, or use BaselineClassifier / BaselineRegressor "
                    "(docs/estimator.md)")


def _by_head(v1, v2):
    """``v1`` built with a v1 head (``tf.contrib.estimator``'s), ``v2`` with a v2 head, whose loss and optimizer
    (a tf.keras one, or a name) are the v2 estimator's: a v1 estimator cannot train a v2 head."""
    head_type = importlib.import_module(f"{ROOT}.head.base_head").Head

    def __new__(cls, *args, **kwargs):
        head = kwargs.get("head", args[0] if args else None)
        return v2(*args, **kwargs) if isinstance(head, head_type) else super(by_head, cls).__new__(cls)
    by_head = type(v1.__name__, (v1,), {"__new__": __new__, "__doc__": v1.__doc__, "__module__": v1.__module__})
    return by_head


def _v1_head(kind: str):
    """tensorflow-estimator's v1 head constructor (the ``_Head`` that TF 1.x's v1 canned estimators take)."""
    head = importlib.import_module(f"{ROOT}.canned.head")
    return getattr(head, {"binary": "_binary_logistic_head_with_sigmoid_cross_entropy_loss",
                          "multi_class": "_multi_class_head_with_softmax_cross_entropy_loss",
                          "regression": "_regression_head"}[kind])


_MEAN = "weighted_mean"       # tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE: tf.contrib.estimator's default


def binary_classification_head(weight_column=None, thresholds=None, label_vocabulary=None,
                               loss_reduction=_MEAN, loss_fn=None, name=None):
    """TF 1.x's ``tf.contrib.estimator.binary_classification_head``: a v1 head for ``DNNEstimator`` and kin."""
    _ready()
    return _v1_head("binary")(weight_column, thresholds, label_vocabulary, loss_reduction, loss_fn, name)


def multi_class_head(n_classes, weight_column=None, label_vocabulary=None, loss_reduction=_MEAN, loss_fn=None,
                     name=None):
    """TF 1.x's ``tf.contrib.estimator.multi_class_head``."""
    _ready()
    return _v1_head("multi_class")(n_classes, weight_column, label_vocabulary, loss_reduction, loss_fn, name)


def regression_head(weight_column=None, label_dimension=1, loss_reduction=_MEAN, loss_fn=None, inverse_link_fn=None,
                    name=None):
    """TF 1.x's ``tf.contrib.estimator.regression_head``."""
    _ready()
    return _v1_head("regression")(weight_column, label_dimension, loss_reduction, loss_fn, inverse_link_fn, name)


def poisson_regression_head(weight_column=None, label_dimension=1, loss_reduction=_MEAN, compute_full_loss=True,
                            name=None):
    """TF 1.x's ``tf.contrib.estimator.poisson_regression_head``: Poisson loss, predictions ``exp(logits)``."""
    import tensorflow as tf

    def loss_fn(labels, logits):
        return tf.nn.log_poisson_loss(labels, logits, compute_full_loss=compute_full_loss)
    return regression_head(weight_column, label_dimension, loss_reduction, loss_fn, tf.math.exp, name)


def logistic_regression_head(weight_column=None, loss_reduction=_MEAN, name=None):
    """TF 1.x's ``tf.contrib.estimator.logistic_regression_head``: labels in [0, 1], predictions ``sigmoid(logits)``."""
    import tensorflow as tf

    def loss_fn(labels, logits):
        return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    return regression_head(weight_column, 1, loss_reduction, loss_fn, tf.math.sigmoid, name)


#: ``tf.contrib.estimator``'s heads, as TF1 mode gives them.
CONTRIB_HEADS = {f.__name__: f for f in (binary_classification_head, multi_class_head, regression_head,
                                         poisson_regression_head, logistic_regression_head)}


def _object_strings(data):
    """``data`` (a DataFrame, a Series or None) with its text columns as ``object``, as pandas before 3.0 kept them:
    pandas 3 stores text as ``StringDtype``, which TensorFlow cannot take."""
    if data is None or not hasattr(data, "dtypes"):
        return data
    import pandas
    text = pandas.api.types.is_string_dtype
    if isinstance(data, pandas.Series):
        return data.astype(object) if text(data.dtype) and data.dtype != object else data
    columns = {k: object for k, dtype in data.dtypes.items() if text(dtype) and dtype != object}
    return data.astype(columns) if columns else data


def _pandas_input_fn(make):
    """tensorflow-estimator's ``pandas_input_fn`` (``make``), fed frames whose text is ``object``, as it expects."""
    def pandas_input_fn(x, y=None, *args, **kwargs):
        return make(_object_strings(x), _object_strings(y), *args, **kwargs)
    return pandas_input_fn


def _without_pandas(*args, **kwargs):
    raise SpecError("tf.estimator.inputs.pandas_input_fn needs pandas: pip install 'tfcluster[pandas]'")
