"""The names TF1 mode serves instead of ``tf.compat.v1``'s, and why each differs.

- ``tf.estimator``: tfcluster's (:mod:`tfcluster.estimator`); TF removed its own in 2.16.
- ``tf.train``: ``tf.compat.v1.train``, with tfcluster's ``SyncReplicasOptimizer``,
  whose steps take one gradient per distinct worker (:mod:`tfcluster.strategies.sync_replicas`).
- ``tf.keras``: tf-keras in graph mode, with ``tf.keras.estimator.model_to_estimator``
  working again, ``compile(distribute=...)`` taking TF1 mode's strategies (:mod:`.distribute`),
  ``Model.fit`` training on TF_CONFIG's cluster when it has ps tasks
  (:mod:`tfcluster.keras`), and, under ``tfcluster local``, progress bars that
  write a line about once a second (tf-keras writes one every 0.05 s to a pipe).
- ``tf.distribute``: TF's, except TF 1.14's ``experimental.MultiWorkerMirroredStrategy`` and
  ``experimental.ParameterServerStrategy``, which train on TF_CONFIG's cluster as TF1 mode's
  strategies do (:mod:`.distribute`); TF 2.21's take no cluster in graph mode.
- ``tf.constant``: TF 1.x turned any sequence into a tensor, ``range(100)`` too;
  TF 2.21 refuses a ``range``.
"""

import types

from ..core import environment, patches

#: Seconds between two lines of a tf-keras progress bar under the launcher (tf-keras: 0.05 s).
PROGRESS_INTERVAL_SECS = 1.0


class Proxy(types.ModuleType):
    """A module that is ``real`` except for the names given."""

    def __init__(self, real, **names):
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real"] = real
        self.__dict__.update(names)

    def __getattr__(self, name):
        return getattr(self.__dict__["_real"], name)

    def __dir__(self):
        return sorted(set(dir(self.__dict__["_real"])) | set(self.__dict__) - {"_real"})


def constant(v1):
    """``tf.constant`` that takes a ``range`` (or any iterable that is not a string or array), as TF 1.x did."""
    original = v1.constant

    def constant(value, dtype=None, shape=None, name="Const", verify_shape=False):
        if isinstance(value, (range, map, filter, zip)) or type(value).__name__ in ("dict_values", "dict_keys"):
            value = list(value)
        return original(value, dtype=dtype, shape=shape, name=name, verify_shape=verify_shape)
    constant.__doc__ = original.__doc__
    constant.__wrapped__ = original
    return constant


def distribute(v1):
    """``tf.distribute`` with TF 1.14's ``experimental.MultiWorkerMirroredStrategy`` and ``ParameterServerStrategy``
    as TF1 mode's strategies, which train on TF_CONFIG's cluster (:mod:`.distribute`)."""
    from .distribute import experimental_members
    real = v1.distribute
    return Proxy(real, experimental=Proxy(real.experimental, **experimental_members()))


def train(v1):
    """``tf.train`` with the fair ``SyncReplicasOptimizer``."""
    from ..strategies.sync_replicas import SyncReplicasOptimizer
    return Proxy(v1.train, SyncReplicasOptimizer=SyncReplicasOptimizer)


def keras(v1):
    """``tf.keras`` (tf-keras) with model_to_estimator, cluster fits and line-friendly progress bars."""
    real = v1.keras
    try:
        import tf_keras  # noqa: F401 - without it tf.keras is Keras 3, which has no graph mode to fix
    except ImportError:
        return real
    from ..estimator.keras import model_to_estimator
    from ..keras import route_fit_through_cluster
    from .distribute import keras_compile_takes_strategies
    route_fit_through_cluster()
    keras_compile_takes_strategies()
    if environment.RESTART_COUNT.get() is not None:   # a task of tfcluster local
        _progress_every_second()
    estimator = Proxy(real.estimator, model_to_estimator=model_to_estimator) if hasattr(real, "estimator") \
        else types.SimpleNamespace(model_to_estimator=model_to_estimator)
    return Proxy(real, estimator=estimator)


def _slower_bars(original):
    def __init__(self, target, width=30, verbose=1, interval=0.05, *args, **kwargs):
        original(self, target, width, verbose, max(interval, PROGRESS_INTERVAL_SECS), *args, **kwargs)
    return __init__


patches.register(patches.Patch(
    "tf1.progress_every_second", "tf_keras.src.utils.generic_utils:Progbar.__init__",
    "progress bars write a line about once a second, so each reaches the launcher as it comes",
    _slower_bars, "TF1 mode under tfcluster local, when its program uses tf.keras",
    params=("self", "target", "width", "verbose", "interval")))


def _progress_every_second():
    """Progress bars that write a line about once a second: each reaches the launcher as it comes."""
    patches.install("tf1.progress_every_second")
