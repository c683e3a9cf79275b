"""Keras 3: what a TF 2.0-2.15 program needs of Keras 2, where Keras 3 lacks it, is one line naming the way to Keras 2.

TF 2.16 made ``tf.keras`` Keras 3. TF2 mode gives a program Keras 2 (tf-keras,
``TF_USE_LEGACY_KERAS=1``) where tfcluster's ``legacy`` extra is installed.
Without it the program gets Keras 3, which trains custom loops over the cluster
and ``fit`` in one process (docs/tf2.md), and two things become one line (exit 2)
instead of a traceback:

- a Keras 2 name Keras 3 lacks (a metric's ``reset_states()``,
  ``tf.keras.optimizers.legacy``, ...): Python's AttributeError or ImportError;
- ``fit`` under ``MultiWorkerMirroredStrategy`` (what a one-process strategy
  becomes on several trainers), which Keras 3 does not run: its first step fails
  converting TF's ``PerReplica`` values (keras-team/keras#20585, open since
  TF 2.16; TF's own multi-worker Keras tutorial fails the same way here).
"""

import os
import re
import types
from typing import Optional, Tuple

from ..core.exits import EXIT_USAGE
from ..topology.cluster import Cluster
from ..topology.taskenv import legacy_keras_available
from .strategies import trainers_spec

#: Keras 3's modules as a missing name's error names them (``keras.api.losses``, ``keras._tf_keras.keras.losses``).
_KERAS3_MODULE = re.compile(r"\bkeras\.(?:api|_tf_keras|src)\b")
#: Keras 3's fit under MultiWorkerMirroredStrategy: ``ValueError: Attempt to convert a value (PerReplica:{...``.
_PER_REPLICA = "Attempt to convert a value (PerReplica:"


def _missing_name(error) -> bool:
    """True when ``error`` is a name missing from one of Keras 3's modules or objects."""
    if isinstance(error, AttributeError):
        # Python names the object that lacks it: a module by its name, an object by its class's module.
        obj = getattr(error, "obj", None)
        where = getattr(obj, "__name__", "") if isinstance(obj, types.ModuleType) else type(obj).__module__
        return where.split(".")[0] == "keras" or bool(_KERAS3_MODULE.search(str(error)))
    return isinstance(error, ImportError) and bool(_KERAS3_MODULE.search(str(error)))


def _multi_worker_fit(error) -> bool:
    """True for Keras 3's fit failing under MultiWorkerMirroredStrategy on this cluster's trainers."""
    if not isinstance(error, ValueError) or _PER_REPLICA not in str(error):
        return False
    return trainers_spec(Cluster.from_environment()) is not None


def tensorboard_line(error) -> Optional[Tuple[str, int]]:
    """``(line, 2)`` when ``error`` is TensorBoard missing (Keras's ``TensorBoard`` callback, ``tf.summary``): TF
    2.0-2.15 installed it with TensorFlow, TF 2.21 does not, and the legacy extra brings it; else None."""
    missing = type(error).__name__ == "TBNotInstalledError" or (
        isinstance(error, ImportError) and (getattr(error, "name", None) or "").split(".")[0] == "tensorboard")
    if not missing:
        return None
    return (f"{str(error).splitlines()[0]}: TensorFlow 2.0-2.15 installed TensorBoard with it, and 2.21 does not; "
            f"install it with tfcluster's legacy extra (pip install 'tfcluster[legacy]') (docs/tf2.md)"), EXIT_USAGE


def keras3_line(error) -> Optional[Tuple[str, int]]:
    """``(line, 2)`` when ``error`` is Keras 3 lacking what a Keras 2 program needs, in a process whose tf.keras
    is Keras 3; else None."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true"):
        return None
    way = ("TF_USE_LEGACY_KERAS is set to Keras 3's value here: unset it, and TF2 mode gives the program Keras 2"
           if legacy_keras_available() else
           "install Keras 2 with tfcluster's legacy extra (pip install 'tfcluster[legacy]', tf-keras), and TF2 "
           "mode gives it to the program")
    if _missing_name(error):
        return (f"{str(error).splitlines()[0]}: the program was written for Keras 2 (TF 2.0-2.15's tf.keras), and "
                f"tf.keras here is Keras 3; {way} (docs/tf2.md)"), EXIT_USAGE
    if _multi_worker_fit(error):
        return ("Keras 3's fit does not run under MultiWorkerMirroredStrategy, the one model over this cluster's "
                f"trainers (keras-team/keras#20585); {way}; a custom training loop runs on Keras 3 (docs/tf2.md)"), \
            EXIT_USAGE
    return None
