"""Horovod's TensorFlow API for TF 1.x programs, served by TF1 mode (Horovod does not build on TF >= 2.16).

The modules, top down: :mod:`.keras` is ``horovod.tensorflow.keras`` and
``horovod.keras`` (graph-mode tf-keras) with :mod:`.callbacks`, Horovod's Keras
callbacks; :mod:`.optimizers` is ``DistributedOptimizer`` for ``tf.train`` and
tf-keras optimizers; :mod:`.objects` sends Python objects between ranks;
:mod:`.tensorflow` is the rest of ``horovod.tensorflow``: ranks, all-reduce,
all-gather, all-to-all, reduce-scatter, broadcast and
``BroadcastGlobalVariablesHook`` on TF's collectives between tfcluster's
tasks. :func:`modules` gives the modules TF1 mode's import finder serves under
Horovod's names; ``hvd.elastic`` is a module whose every name is one line
saying what to use instead (docs/horovod.md).
"""

import importlib
import types

from ..core.errors import SpecError
from . import tensorflow

__all__ = ["modules"]

#: Horovod's modules not served, and what to use instead.
NOT_COVERED = {
    "horovod.tensorflow.elastic": "tfcluster local --max-restarts (every rank restarts from rank 0's checkpoint; "
                                  "docs/horovod.md)",
}


class _NotCovered(types.ModuleType):
    """A Horovod module tfcluster does not serve: each of its names is one line."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise SpecError(f"{self.__name__}.{name} is not covered by tfcluster's Horovod; use "
                        f"{NOT_COVERED[self.__name__]}")


class _Served(types.ModuleType):
    """A Horovod module filled from one of tfcluster's on first use (the Keras ones import tf-keras)."""

    def __init__(self, name, source, names=None):
        super().__init__(name, f"Horovod's {name}, served by tfcluster (docs/horovod.md).")
        self.__dict__.update(_tfcluster_source=source, _tfcluster_names=names, __path__=[])

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        source = importlib.import_module(self.__dict__["_tfcluster_source"], __name__)
        for key in self.__dict__["_tfcluster_names"] or source.__all__:
            self.__dict__.setdefault(key, getattr(source, key))
        if name not in self.__dict__:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        return self.__dict__[name]


def modules() -> dict:
    """``{name: module}`` of Horovod's names TF1 mode serves (TensorFlow imported)."""
    from . import objects, optimizers
    package = types.ModuleType("horovod", "Horovod's API, served by tfcluster (docs/horovod.md).")
    api = types.ModuleType("horovod.tensorflow", tensorflow.__doc__)
    api.__dict__.update({name: getattr(tensorflow, name) for name in tensorflow.__all__})
    api.__dict__.update({name: getattr(objects, name) for name in objects.__all__})
    api.DistributedOptimizer = optimizers.DistributedOptimizer
    api.BroadcastGlobalVariablesHook = tensorflow.hook_class()      # the class itself, for isinstance
    package.__path__ = api.__path__ = []     # packages: their submodules import (or say they are not served)
    served = {"horovod": package, "horovod.tensorflow": api,
              "horovod.tensorflow.elastic": _NotCovered("horovod.tensorflow.elastic")}
    for keras in ("horovod.tensorflow.keras", "horovod.keras"):
        served[keras] = _Served(keras, ".keras")
        served[f"{keras}.callbacks"] = _Served(f"{keras}.callbacks", ".callbacks")
        served[keras].__dict__["callbacks"] = served[f"{keras}.callbacks"]
    package.__dict__.update(tensorflow=api, keras=served["horovod.keras"])
    api.elastic, api.keras = served["horovod.tensorflow.elastic"], served["horovod.tensorflow.keras"]
    return served
