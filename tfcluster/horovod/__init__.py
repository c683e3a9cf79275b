"""Horovod's TensorFlow API for TF 1.x programs, served by TF1 mode (Horovod does not build on TF >= 2.16).

:mod:`.tensorflow` is ``horovod.tensorflow``: ranks, all-reduce, broadcast,
``DistributedOptimizer`` and ``BroadcastGlobalVariablesHook`` on TF's
collectives between tfcluster's tasks. :func:`modules` gives the modules TF1
mode's import finder serves under Horovod's names; what is not covered yet
(``horovod.tensorflow.keras``, ``horovod.keras``, ``hvd.elastic``) is a
module whose every name is one line saying so (docs/horovod.md).
"""

import types

from ..core.errors import SpecError
from . import tensorflow

__all__ = ["modules"]

#: Horovod's modules not served yet, and what to use instead.
NOT_COVERED = {
    "horovod.tensorflow.keras": "horovod.tensorflow with a tf.compat.v1.train optimizer for now (docs/horovod.md)",
    "horovod.keras": "horovod.tensorflow with a tf.compat.v1.train optimizer for now (docs/horovod.md)",
    "horovod.tensorflow.elastic": "tfcluster local --max-restarts (every rank restarts from rank 0's checkpoint; "
                                  "docs/horovod.md)",
}


class _NotCovered(types.ModuleType):
    """A Horovod module tfcluster does not serve: each of its names is one line."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise SpecError(f"{self.__name__}.{name} is not covered by tfcluster's Horovod yet; use "
                        f"{NOT_COVERED[self.__name__]}")


def modules() -> dict:
    """``{name: module}`` of Horovod's names TF1 mode serves (TensorFlow imported)."""
    package = types.ModuleType("horovod", "Horovod's API, served by tfcluster (docs/horovod.md).")
    api = types.ModuleType("horovod.tensorflow", tensorflow.__doc__)
    api.__dict__.update({name: getattr(tensorflow, name) for name in tensorflow.__all__})
    api.BroadcastGlobalVariablesHook = tensorflow.hook_class()      # the class itself, for isinstance
    package.__path__, api.__path__ = [], []         # packages: their submodules import (or say they are not served)
    package.tensorflow = api
    served = {"horovod": package, "horovod.tensorflow": api}
    for name in NOT_COVERED:
        served[name] = _NotCovered(name)
    api.elastic, api.keras = served["horovod.tensorflow.elastic"], served["horovod.tensorflow.keras"]
    package.keras = served["horovod.keras"]
    return served
