"""The other names TF 1.x code imports the Estimator by, served in TF1 mode as ``tf.estimator`` is.

Legacy code and the libraries it uses reach the Estimator by more names than
``tf.estimator`` (tensorflow/models#11252, alibaba/EasyRec#484,
tensorflow/ranking#362, tensorflow/hub#898):

- ``import tensorflow_estimator as tf_estimator`` and ``tf_estimator.estimator``
  (the package's v1 API), also as ``tensorflow_estimator._api.v1.estimator``
  and ``...python.estimator.api._v1.estimator`` (``_v2`` alike): tfcluster's
  ``tf.estimator``, the same object;
- ``from tensorflow_estimator.python.estimator[.canned|.export|...] import ...``
  and TF 1.13's ``tensorflow.python.estimator...`` (the package moved out of
  TensorFlow in 1.14): the package's own modules, loaded as tfcluster's canned
  estimators load them (:func:`tfcluster.estimator.canned.submodule`: on
  tfcluster's Estimator, with tf-keras), and the classes a program hands the
  Estimator (``RunConfig``, ``TrainSpec``, ``EvalSpec``, ``train_and_evaluate``,
  exporters, ``numpy_input_fn``, ``WarmStartSettings``, ``VocabInfo``:
  ``canned.PUBLIC``) are ``tf.estimator``'s there too. ``EstimatorSpec`` and
  ``ModeKeys`` stay the package's: tfcluster's Estimator takes its
  ``EstimatorSpec`` as its own, and the mode keys are the same strings;
- ``tf.compat.v1.estimator``, ``tf.compat.v2.estimator`` and
  ``import tensorflow.compat.v1 as tf; tf.estimator``: tfcluster's.

A module of the package that does not load on TF 2.21 (the TPU estimator) is
one line (:class:`~tfcluster.core.errors.TF1RemovedError`).
"""

import importlib.machinery
import re
import sys
import threading
import types

from ..core.errors import TF1RemovedError
from ..core.patches import Patch, register

PACKAGE = "tensorflow_estimator"
#: Where TF 1.13 and before kept the package (it moved to tensorflow_estimator.python.estimator in 1.14).
OLD_ROOT = "tensorflow.python.estimator"
#: The package's generated API modules: each is the Estimator API itself.
_API = re.compile(r"tensorflow_estimator\.(?:_api\.v[12]|python\.estimator\.api\._v[12])\.estimator")
#: Their parents, namespaces only.
_API_PARENTS = re.compile(r"tensorflow_estimator\.(?:_api(?:\.v[12])?|python\.estimator\.api(?:\._v[12])?)")

_loading = threading.local()


def served(fullname: str) -> bool:
    """True for a module name this module serves (below ``tensorflow_estimator`` or TF 1.13's old root)."""
    return any(fullname == root or fullname.startswith(root + ".") for root in (PACKAGE, OLD_ROOT))


def top(api) -> types.ModuleType:
    """The ``tensorflow_estimator`` package: its ``estimator`` is ``api`` (TF1 mode's ``tf.estimator``); its
    modules import from the installed package (without the legacy extra, only ``estimator`` is there)."""
    package = sys.modules.get(PACKAGE)
    if package is None or getattr(package, "__file__", None):     # else the canned estimators' stand-in: kept
        package = types.ModuleType(PACKAGE, "tensorflow-estimator, as TF1 mode serves it (tfcluster's Estimator).")
        # The installed package's place, not TF1 mode's (none: the legacy extra is not installed).
        spec = importlib.machinery.PathFinder.find_spec(PACKAGE) or importlib.machinery.ModuleSpec(
            PACKAGE, None, is_package=True)
        package.__spec__, package.__path__ = spec, list(spec.submodule_search_locations or [])
    package.estimator = api
    return package


def module(fullname: str, api):
    """The module ``fullname`` names, or None when the import system should load it (one being loaded here)."""
    if getattr(_loading, "active", False):
        return None
    if fullname == PACKAGE:
        return top(api)
    if fullname == OLD_ROOT or fullname.startswith(OLD_ROOT + "."):
        fullname = "tensorflow_estimator.python.estimator" + fullname[len(OLD_ROOT):]
    if _API.fullmatch(fullname):
        return api
    if _API_PARENTS.fullmatch(fullname):
        namespace = types.ModuleType(fullname)
        namespace.__path__ = []
        return namespace
    from ..estimator import canned
    _loading.active = True
    try:
        loaded = canned.submodule(fullname)
    except ImportError as e:
        raise TF1RemovedError(fullname, f"tf.estimator's names (this module does not load on TensorFlow 2.21: "
                              f"{e}; docs/estimator.md lists what is covered)", since="2.16") from None
    finally:
        _loading.active = False
    return loaded


def _estimator(original):
    from .. import estimator
    return estimator


_WHY = "TF 1.x code reaches the Estimator as tf.compat.v1.estimator and through import tensorflow.compat.v1 as tf"
# TF's API holds tf.compat.v1 and tf.compat.v2 twice: at the top (``import tensorflow.compat.v1``), and inside
# compat.v1 (what TF1 mode's ``tf``, which is compat.v1, reaches as ``tf.compat.v1``).
_COMPAT = {"compat_v1": "compat.v1", "compat_v2": "compat.v2", "v1_compat_v1": "compat.v1.compat.v1",
           "v1_compat_v2": "compat.v1.compat.v2"}
for _name, _module in _COMPAT.items():
    register(Patch(f"tf1.{_name}_estimator", f"tensorflow._api.v2.{_module}:estimator", _WHY, _estimator, "TF1 mode",
                   adds=True))

#: The patches of this module TF1 mode installs.
PATCHES = tuple(f"tf1.{name}_estimator" for name in _COMPAT)
