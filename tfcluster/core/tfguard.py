"""Which TensorFlow this process has: none, two builds on top of each other, or another version.

tfcluster declares TensorFlow as a choice (``pyproject.toml``: the extras
``tensorflow`` and ``tensorflow-cpu``), so an install can lack it. Where
tfcluster first needs TensorFlow (hosting a server, TF1 mode, telling the ps
tasks that a trainer is done) :func:`require_tensorflow` stops with one line
naming the extra to install. :func:`tensorflow_warnings` finds the two installs
that break silently:

- ``tensorflow`` and ``tensorflow-cpu`` (or another build) both installed: they
  unpack into the same ``tensorflow/`` folder, so the one installed last
  overwrote the other's files, and a GPU build may have lost its GPUs;
- a TensorFlow other than 2.21.x, the version tfcluster is built and tested for.

Everything here reads the installed distributions (``importlib.metadata``)
and never imports TensorFlow, so the commands that do not need it (``spec``,
``status``) stay fast and work without it.
"""

import importlib.metadata
import importlib.util
import logging
import os
import re
from typing import Mapping, Optional

from . import environment
from .checks import switch_from
from .errors import TensorFlowMissingError

log = logging.getLogger("tfcluster")

#: The TensorFlow release tfcluster is built and tested for.
SUPPORTED_SERIES = "2.21"
#: Distributions that each install a whole TensorFlow into the same ``tensorflow/`` folder.
#: (``tensorflow-intel`` and ``tensorflow-macos`` are left out: ``tensorflow`` itself depends on them.)
BUILDS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly", "tf-nightly-cpu", "intel-tensorflow")
INSTALL_HINT = "pip install 'tfcluster[tensorflow]' (or 'tfcluster[tensorflow-cpu]')"
#: Set once the warnings were shown, so that the processes a command starts do not repeat them.
CHECKED_ENV = environment.TF_CHECKED.name


def installed_builds() -> dict:
    """``{distribution: version}`` of every TensorFlow build installed (see :data:`BUILDS`)."""
    found = {}
    for name in BUILDS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def tensorflow_importable() -> bool:
    """True when ``import tensorflow`` would find a package (nothing is imported)."""
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError, AttributeError):
        return False


def require_tensorflow(needed_for: str):
    """Raise :class:`TensorFlowMissingError` unless TensorFlow can be imported; ``needed_for`` says who needs it."""
    if not tensorflow_importable():
        raise TensorFlowMissingError(f"TensorFlow is not installed ({needed_for} needs it); {INSTALL_HINT}")


def tensorflow_warnings(builds: Mapping[str, str]) -> list:
    """What is wrong with the TensorFlow ``builds`` installed (:func:`installed_builds`), one line each."""
    lines = []
    if len(builds) > 1:
        named = " and ".join(f"{name} {version}" for name, version in builds.items())
        lines.append(f"{named} are installed: they share one tensorflow/ folder, so the last one installed "
                     "overwrote the other (a GPU build may have lost its GPUs); keep one: pip uninstall -y "
                     f"{' '.join(builds)}, then {INSTALL_HINT}")
    off = {name: v for name, v in builds.items() if not re.match(rf"{re.escape(SUPPORTED_SERIES)}(\.|$)", v)}
    for name, version in off.items():
        lines.append(f"{name} {version} is installed; tfcluster is built and tested for TensorFlow "
                     f"{SUPPORTED_SERIES}.x: {INSTALL_HINT}")
    return lines


def check_tensorflow(needed_for: Optional[str] = None, environ: Optional[dict] = None):
    """Require TensorFlow when ``needed_for`` says who needs it; log each of :func:`tensorflow_warnings` once per run.

    ``environ`` (default: this process's) remembers that the check was made,
    so the tasks a command starts, which inherit it, stay quiet.
    """
    if needed_for:
        require_tensorflow(needed_for)
    env = os.environ if environ is None else environ
    if switch_from(environment.TF_CHECKED, False, env) or not tensorflow_importable():
        return
    env[CHECKED_ENV] = "1"
    for line in tensorflow_warnings(installed_builds()):
        log.warning("%s", line)
