"""TF1 mode: run a TF 1.x graph script unchanged on TensorFlow 2.21.

``python -m tfcluster.tf1 script.py ARGS`` (or ``tfcluster start/local --tf1``)
runs the script as ``__main__`` after :func:`install`, which makes

- ``import tensorflow as tf`` give ``tf.compat.v1`` with v2 behaviour disabled,
  while ``import tensorflow.python...`` and ``tensorflow.compat.v2`` keep working;
- ``tf.contrib`` the commonly used names mapped to TF 2.21 (:mod:`.contrib`),
  ``tf.contrib.slim`` and its kin from the tf-slim package (:mod:`.slim`);
  any other contrib name fails with one line naming its replacement;
- ``tensorflow_estimator``, TF 1.13's ``tensorflow.python.estimator`` and ``tf.compat.v1.estimator``
  give tfcluster's Estimator, as ``tf.estimator`` does (:mod:`.estimator_paths`);
- ``tensorflow.examples.tutorials.mnist.input_data`` read local MNIST or
  Fashion-MNIST IDX files (:mod:`.mnist`); it never downloads;
- DeepRec's embedding variables (``tf.get_embedding_variable``,
  ``tf.feature_column.categorical_column_with_embedding``) are tfcluster's (:mod:`.deeprec`);
- ``tf.layers`` work through tf-keras (TF_USE_LEGACY_KERAS=1) when installed;
- sessions survive TF 2.21's false duplicate aborts (pitfalls item 15), and
  say so when MonitoredTrainingSession throws progress away (:mod:`.robust`).

docs/tf1.md lists exactly what the mode covers and what it does not.
Importing this package does not import TensorFlow. Its modules:
:mod:`.contrib` (``tf.contrib``), :mod:`.distribute` (its strategies), :mod:`.slim` (tf-slim's names),
:mod:`.estimator_paths` (the Estimator's other import names), :mod:`.mnist` (the tutorials' ``input_data``),
:mod:`.mnist_model` (the tutorials' ``mnist.py`` model), :mod:`.overrides`
(the names served instead of ``tf.compat.v1``'s), :mod:`.deeprec` (DeepRec's embedding-variable names),
:mod:`.robust` (the session
fixes), ``__main__`` (``python -m tfcluster.tf1 script.py``) and :mod:`.forkserver` (TF1-mode tasks
forked from one process that imported all of this once, for ``tfcluster local --tf1``).
"""

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import types

from ..core import environment, patches
from ..core.checks import seconds_from
from ..core.duplicates import rerun_in_every_session
from ..core.errors import TF1RemovedError
from ..core.logs import quiet_keras_thread_notice, tensorflow_lines_once
from ..graph.sparse import install as install_distinct_lookups
from ..horovod import modules as horovod_modules
from ..topology.taskenv import legacy_keras_available, prepare_this_process
from ..runtime.server import READY_POLL_SECS
from ..training.session import THREAD_GRACE_SECS
from . import estimator_paths, slim

__all__ = ["install", "installed", "legacy_keras_available", "tf1_command", "TF1RemovedError",
           "READY_POLL_ENV", "DEFAULT_READY_POLL_SECS", "STOP_GRACE_ENV", "DEFAULT_STOP_GRACE_SECS"]

log = logging.getLogger("tfcluster")

#: Environment variable: seconds between "is the model ready?" polls in TF1 mode (TF's default is 30).
READY_POLL_ENV = environment.TF1_READY_POLL_SECS.name
DEFAULT_READY_POLL_SECS = READY_POLL_SECS
#: Environment variable: seconds a closing MonitoredSession waits for its threads (TF's default is 120).
STOP_GRACE_ENV = environment.TF1_STOP_GRACE_SECS.name
DEFAULT_STOP_GRACE_SECS = THREAD_GRACE_SECS
#: ``python -m tfcluster.tf1 --session-fixes-only script.py``: ``import tensorflow`` stays TensorFlow 2.
SESSION_FIXES_ONLY = "--session-fixes-only"

_MNIST_NAMES = ("tensorflow.examples.tutorials.mnist.input_data",
                "tensorflow.contrib.learn.datasets.mnist",
                "tensorflow.contrib.learn.python.learn.datasets.mnist")

_installed = None


def installed():
    """The ``tensorflow`` stand-in if TF1 mode is installed in this process, else None."""
    return _installed


def _mnist_module(name: str) -> types.ModuleType:
    from . import mnist as _mnist  # numpy; only TF1 mode itself needs it, not the CLI
    m = types.ModuleType(name, _mnist.__doc__)
    m.__dict__.update({k: getattr(_mnist, k) for k in _mnist.__all__})
    return m


class TF1Module(types.ModuleType):
    """``tensorflow`` in TF1 mode: ``tf.compat.v1`` plus ``contrib``, ``examples`` and :mod:`.overrides`."""

    def __init__(self, real, v1, contrib, examples, estimator, overrides):
        super().__init__("tensorflow", "TensorFlow as TF 1.x scripts knew it (tfcluster TF1 mode: tf.compat.v1).")
        d = self.__dict__
        d["__path__"] = list(real.__path__)  # so tensorflow.python... still imports from the real package
        d["__file__"] = real.__file__
        d["__spec__"] = real.__spec__
        d["_tfcluster_real"] = real
        d["_tfcluster_v1"] = v1
        d["contrib"] = contrib
        d["examples"] = examples
        d["estimator"] = estimator          # tfcluster's: TensorFlow's own is gone since 2.16
        d["_tfcluster_overrides"] = overrides   # name -> a function of compat.v1 making the TF1-mode value

    def __getattr__(self, name):
        v1, real = self.__dict__["_tfcluster_v1"], self.__dict__["_tfcluster_real"]
        make = self.__dict__["_tfcluster_overrides"].get(name)
        if make is not None:
            value = self.__dict__[name] = make(v1)
            return value
        try:
            value = getattr(v1, name)
        except AttributeError:
            value = getattr(real, name, None) if name.startswith("_") else None
            if value is None:
                value = sys.modules.get(f"tensorflow.{name}")
            if value is None:
                raise AttributeError(f"module 'tensorflow' (TF1 mode, tf.compat.v1) has no attribute {name!r}") \
                    from None
        self.__dict__[name] = value
        return value

    def __dir__(self):
        return sorted(set(dir(self.__dict__["_tfcluster_v1"])) | {"contrib", "examples", "estimator"})

    def __repr__(self):
        return f"<module 'tensorflow' (TF1 mode: tf.compat.v1 of {self.__dict__['_tfcluster_real'].__version__})>"


class _ObjectLoader(importlib.abc.Loader):
    """Loads a module object that already exists."""

    def __init__(self, module):
        self.module = module
        self.spec = getattr(module, "__spec__", None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        if self.spec is not None:       # a real package under a TF 1.x name (tf_slim) keeps its own spec
            module.__spec__ = self.spec


class _TF1Finder(importlib.abc.MetaPathFinder):
    """Imports ``tensorflow.contrib``, ``.estimator``, ``.keras`` (and ``keras``), ``.examples`` and Horovod from TF1 mode."""

    def __init__(self, tf, roots, modules):
        self.tf, self.roots, self.modules = tf, roots, modules

    def find_spec(self, fullname, path=None, target=None):
        module = self.modules.get(fullname)
        parts = fullname.split(".")
        if module is None and estimator_paths.served(fullname):
            module = estimator_paths.module(fullname, self.tf.estimator)
            if module is None:          # one of its own modules, loading: the installed package's
                return None
        if module is None and slim.tf_slim_name(fullname):
            module = slim.import_module(fullname)
        if module is None and parts[0] == "keras" and "keras" in self.roots:
            parts = ["tensorflow"] + parts      # TF 1.x-era Keras 2 (import keras): tf-keras, as tf.keras
        if module is None and parts[0] == "tensorflow" and len(parts) > 1 and parts[1] in self.roots:
            module = getattr(self.tf, parts[1])
            for part in parts[2:]:
                module = getattr(module, part)  # an unmapped name raises TF1RemovedError here
            if not isinstance(module, types.ModuleType):
                return None
        if module is None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _ObjectLoader(module), is_package=hasattr(module, "__path__"))
        if sys.modules.get(fullname) is module:
            # Loaded under this name just now (a module of tensorflow_estimator): the import system then takes the
            # module's own spec, whose loader would run its code again into a second module; this one is taken.
            module.__spec__ = spec
        return spec


def _examples_package():
    names = ["tensorflow.examples", "tensorflow.examples.tutorials", "tensorflow.examples.tutorials.mnist"]
    modules = {n: types.ModuleType(n) for n in names}
    for m in modules.values():
        m.__path__ = []
    modules["tensorflow.examples"].tutorials = modules["tensorflow.examples.tutorials"]
    modules["tensorflow.examples.tutorials"].mnist = modules["tensorflow.examples.tutorials.mnist"]
    input_data = _mnist_module(_MNIST_NAMES[0])
    modules["tensorflow.examples.tutorials.mnist"].input_data = input_data
    modules[_MNIST_NAMES[0]] = input_data
    from . import mnist_model  # the tutorials' model: inference, loss, training, evaluation
    model = types.ModuleType("tensorflow.examples.tutorials.mnist.mnist", mnist_model.__doc__)
    model.__dict__.update({k: getattr(mnist_model, k) for k in mnist_model.__all__})
    modules["tensorflow.examples.tutorials.mnist"].mnist = model
    modules[model.__name__] = model
    return modules


def install(ready_poll_secs=None, retry_duplicates: bool = True):
    """Make ``import tensorflow`` give the TF1-mode module in this process; returns it.

    Call it before the script imports TensorFlow. It imports TensorFlow itself
    (about 4 s of CPU), disables v2 behaviour, and is idempotent.
    """
    global _installed
    if _installed is not None:
        return _installed
    if "tensorflow" not in sys.modules:
        prepare_this_process()
    elif os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True") and legacy_keras_available():
        log.warning("TensorFlow was imported before TF1 mode was installed, without TF_USE_LEGACY_KERAS=1: "
                    "tf.layers may fail")
    from ..topology.taskenv import import_tensorflow
    real = import_tensorflow()      # its loading lines hidden when its logs are quiet
    from tensorflow.python.util import deprecation

    from .. import estimator
    from . import contrib as contrib_mod
    from . import overrides

    v1 = real.compat.v1
    with deprecation.silence():
        v1.disable_v2_behavior()
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") not in ("", "0"):
        _quiet_deprecations(deprecation)
    slim.restore_moved_names()
    install_distinct_lookups()      # replica_device_setter's tables: each distinct row read once (graph/sparse.py)
    from . import robust
    robust.math_in_sessions()       # bfloat16 math where the CPU has it, in the program's sessions (graph/precision.py)
    modules = _examples_package()
    modules.update(horovod_modules())       # horovod.tensorflow: tfcluster's (tfcluster/horovod)
    for name in _MNIST_NAMES[1:]:
        modules[name] = _mnist_module(name)
    contrib = contrib_mod.build(v1, modules[_MNIST_NAMES[1]])
    contrib.learn.datasets.mnist = modules[_MNIST_NAMES[1]]
    contrib.learn.python.learn.datasets.mnist = modules[_MNIST_NAMES[2]]
    from . import deeprec
    stand_in = TF1Module(real, v1, contrib, modules["tensorflow.examples"], estimator,
                         {"constant": overrides.constant, "train": overrides.train, "keras": overrides.keras,
                          "distribute": overrides.distribute, **deeprec.overrides()})
    # tensorflow.keras is TF1 mode's tf.keras (tf-keras's v1 API), as in TF 1.x; import keras too, where tf-keras is.
    roots = ("contrib", "estimator") + (("keras",) if legacy_keras_available() else ())
    sys.meta_path.insert(0, _TF1Finder(stand_in, roots, modules))
    sys.modules["tensorflow"] = stand_in
    sys.modules[estimator_paths.PACKAGE] = estimator_paths.top(estimator)
    for name in estimator_paths.PATCHES:
        patches.install(name)

    install_session_fixes(ready_poll_secs, retry_duplicates)
    _installed = stand_in
    return stand_in


def install_session_fixes(ready_poll_secs=None, retry_duplicates: bool = True):
    """TF1 mode's fixes to TF's sessions, without the rest of TF1 mode (``import tensorflow`` unchanged).

    For scripts that use ``tensorflow.compat.v1`` themselves: readiness polled
    every 0.2 s (as tfcluster's own sessions), a closing session that does not wait two minutes, false
    duplicates rerun, every recovery said out loud, a non-chief's sessions
    limited to the ps and itself, a word when a trainer trains a private copy,
    iterators without tf.data's autotune thread, and each ``tf.logging`` line
    once, also after ``tf.app.run`` set up absl's logging.
    """
    from tensorflow.python.platform import tf_logging
    from . import robust
    if ready_poll_secs is None:
        ready_poll_secs = seconds_from(environment.TF1_READY_POLL_SECS, DEFAULT_READY_POLL_SECS)
    if ready_poll_secs != robust.TF_DEFAULT_RECOVERY_WAIT:
        robust.fast_ready_polling(ready_poll_secs)
    stop_grace = seconds_from(environment.TF1_STOP_GRACE_SECS, DEFAULT_STOP_GRACE_SECS)
    if stop_grace != robust.TF_DEFAULT_STOP_GRACE:
        robust.quick_stop(stop_grace)
    robust.quiet_late_queue_runners()
    robust.quiet_second_supervisor_stop()
    robust.initialise_in_own_session()
    if retry_duplicates:
        rerun_in_every_session()
    robust.warn_on_recovery()
    robust.cluster_sessions()
    robust.iterators_without_autotune_thread()
    tf_logging.get_logger()     # TF's handler is on its logger from here on, before the script can log
    tensorflow_lines_once()
    quiet_keras_thread_notice()


def _quiet_deprecations(deprecation):
    """TF 1.x's API is what TF1 mode runs: TF's notices that it is deprecated are noise there (--verbose shows them)."""
    import warnings
    deprecation._PRINT_DEPRECATION_WARNINGS = False
    warnings.filterwarnings("ignore", message=r"`tf\.layers\.\w+` is deprecated", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"`Model\.state_updates` will be removed", category=UserWarning)
    # tf-slim's layers call TF's own legacy layers through layer.apply (tf1/slim.py)
    warnings.filterwarnings("ignore", message=r"`layer\.apply` is deprecated", category=UserWarning)


# ------------------------------------------------------------------ commands
def tf1_command(command, session_fixes_only: bool = False) -> list:
    """Rewrite ``python [OPTS] script.py ARGS`` to ``python [OPTS] -m tfcluster.tf1 script.py ARGS``.

    ``session_fixes_only``: ``-m tfcluster.tf1 --session-fixes-only``, where
    ``import tensorflow`` stays TensorFlow 2. A command that is already in TF1
    mode is returned as it is; anything that is not a Python script or
    ``-m module`` raises TfclusterError.
    """
    from ..core.programs import mode_command
    return mode_command(command, "tfcluster.tf1", "--tf1", [SESSION_FIXES_ONLY] if session_fixes_only else [])
