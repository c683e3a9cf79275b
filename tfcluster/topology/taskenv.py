"""The environment a task runs in: its TF_CONFIG, quiet TensorFlow logs, legacy Keras, shared ports.

Every process tfcluster starts or hosts gets its environment here, so that a
task started by ``tfcluster local``, by ``tfcluster start -- CMD``, in TF1 mode
or as a hosted ps sees the same settings:

- ``TF_CONFIG``: the cluster and this task (what Kubeflow, SageMaker and
  ``tf.distribute`` use);
- ``TF_CPP_MIN_LOG_LEVEL=2`` and ``GRPC_VERBOSITY=NONE`` unless verbose: TF's
  C++ logs are noise to a user, and gRPC logs a failed bind before TF turns it
  into an error that tfcluster reports in one line;
- ``TF_USE_LEGACY_KERAS=1`` when tf-keras is installed: ``tf.layers`` and
  graph-mode ``tf.keras`` need it (docs/pitfalls.md, item 13);
- ``TF_GRPC_REUSE_PORT=1`` for a task whose port the launcher holds
  (:mod:`tfcluster.topology.ports`);
- ``PYTHONUNBUFFERED=1``: lines reach the launcher as they are printed;
- a ps only: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: glibc asks for
  transparent huge pages on its big allocations (a table's parts): a lookup
  or a sparse update touches rows all over a table of gigabytes, and with 4 KB
  pages each row costs a TLB miss. Click-through at H = 1,000,000: 1.1 times
  the examples/s (docs/embeddings.md). glibc 2.35 or later; elsewhere ignored.

A variable the user set is kept, except the log level under ``verbose``.
Importing this module does not import TensorFlow.
"""

import contextlib
import importlib.util
import os
import secrets
import sys
import time
from typing import Mapping, MutableMapping, Optional

from ..core import environment
from .cluster import Role
from .ports import REUSE_ENV

#: The directory that holds the ``tfcluster`` package, for children that must import this very copy
#: (this file is tfcluster/topology/taskenv.py).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_id(environ: Optional[Mapping] = None) -> Optional[str]:
    """The run this task belongs to: ``TFCLUSTER_RUN_ID`` (``tfcluster local`` sets it), else Slurm's job id
    (a requeued job keeps it), else None. A restarted task of the same run resumes that run's checkpoints."""
    env = os.environ if environ is None else environ
    return environment.RUN_ID.get(env) or env.get("SLURM_JOB_ID") or None


def new_run_id() -> str:
    """A run id nobody has used: the launch's time, and four random hex digits for launches in the same second."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def legacy_keras_available() -> bool:
    """True when the tf-keras package (graph-mode tf.layers and tf.keras on TF 2.21) is installed."""
    try:
        return importlib.util.find_spec("tf_keras") is not None
    except (ImportError, ValueError):
        return False


def set_tensorflow_logging(env: MutableMapping, verbose: bool = False) -> MutableMapping:
    """TF's C++ logs and gRPC's quiet in ``env`` unless ``verbose``; returns ``env``."""
    if verbose:
        env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    else:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.setdefault("GRPC_VERBOSITY", "NONE")
    return env


def set_legacy_keras(env: MutableMapping) -> MutableMapping:
    """``TF_USE_LEGACY_KERAS=1`` in ``env`` when tf-keras is installed; returns ``env``."""
    if legacy_keras_available():
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    return env


#: glibc's tunable that makes malloc madvise its big regions for transparent huge pages (glibc >= 2.35).
HUGE_PAGES = "glibc.malloc.hugetlb"


def _tunables(env: Mapping) -> list:
    return [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]


def _sets_huge_pages(env: Mapping) -> bool:
    return any(t.split("=", 1)[0] == HUGE_PAGES for t in _tunables(env))


def set_huge_pages(env: MutableMapping) -> MutableMapping:
    """Add ``glibc.malloc.hugetlb=1`` to ``env``'s GLIBC_TUNABLES unless it sets that tunable; returns ``env``."""
    if not _sets_huge_pages(env):
        env["GLIBC_TUNABLES"] = ":".join(_tunables(env) + [f"{HUGE_PAGES}=1"])
    return env


def huge_pages_pending(env: Optional[Mapping] = None) -> bool:
    """True when this process would get huge pages by starting again with :func:`set_huge_pages`'s environment:
    glibc 2.35 or later, a kernel that gives them on request only (``[madvise]``), the tunable not set."""
    import platform
    if _sets_huge_pages(os.environ if env is None else env):
        return False
    libc, version = platform.libc_ver()
    try:
        recent = libc == "glibc" and tuple(int(x) for x in version.split(".")[:2]) >= (2, 35)
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return recent and "[madvise]" in f.read()
    except (OSError, ValueError):
        return False


def quiet_tensorflow(verbose: bool = False):
    """Silence TensorFlow's C++ logging in this process unless ``verbose``, and load TF now, quietly.

    Call it before ``import tensorflow``: TF prints absl's and oneDNN's
    loading lines before any log level applies (see :func:`native_stderr_silenced`).
    """
    set_tensorflow_logging(os.environ, verbose)
    import_tensorflow()


def native_logs_quiet() -> bool:
    """True when TensorFlow's C++ logs are quieted (TF_CPP_MIN_LOG_LEVEL 2 or more)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") not in ("", "0", "1")


@contextlib.contextmanager
def native_stderr_silenced(active: bool = True):
    """While active, this process's native stderr (fd 2) goes nowhere."""
    # TensorFlow's C++ prints a few lines before its log level takes effect
    # (absl's "All log messages before absl::InitializeLog()", the CUDA stub's
    # "Could not find cuda drivers", cuInit at the first device listing), so
    # TF_CPP_MIN_LOG_LEVEL alone cannot keep stderr to tfcluster's own lines.
    if not active:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def import_tensorflow():
    """Import TensorFlow; when its logs are quieted, also hide the lines it prints while loading."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    with native_stderr_silenced(native_logs_quiet()):
        import tensorflow as tf
    return tf


#: What TF 2.21's ``__init__`` imports eagerly so that Keras's optimizers register for SavedModel: Keras 3's, or
#: tf-keras's under TF_USE_LEGACY_KERAS. TF goes on without them (``except ImportError: pass``), as it does
#: where no Keras is installed.
KERAS_EAGER_IMPORTS = ("keras.src.optimizers", "tf_keras.src.optimizers")


def prepare_this_process(verbose: bool = False, keras: bool = True):
    """Set, before TensorFlow is imported here, what a task's environment would hold.

    ``keras=False``: this process builds no model (it hosts a server, or tells
    the ps that a task is done), so TF's eager import of Keras is skipped: Keras
    3 brings in its scikit-learn wrapper (scikit-learn and SciPy) when they are
    installed, tf-keras the whole of tf-keras. Without tf-keras's, a ps's import
    takes 0.83 times the CPU and 56 MiB less memory, on cores the trainers are
    importing TF on (docs/map.md, "What a task's process imports").
    """
    set_tensorflow_logging(os.environ, verbose)
    if keras:
        set_legacy_keras(os.environ)
    elif "tensorflow" not in sys.modules:
        # A module set to None in sys.modules is one Python's import refuses at once; setdefault keeps one loaded.
        for name in KERAS_EAGER_IMPORTS:
            sys.modules.setdefault(name, None)


def task_environment(cluster, verbose: bool = False, base: Optional[dict] = None, *,
                     reuse_port: bool = False, import_tfcluster: bool = False) -> dict:
    """The environment of a task's process: ``base`` (this process's) plus the settings in the module doc.

    ``reuse_port``: the launcher holds the task's port until it serves.
    ``import_tfcluster``: the child must import the tfcluster that runs this process.
    """
    env = dict(os.environ if base is None else base)
    env["TF_CONFIG"] = cluster.tf_config()
    set_tensorflow_logging(env, verbose)
    set_legacy_keras(env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cluster.task is not None and cluster.task.role is Role.PS:
        set_huge_pages(env)
    if reuse_port:
        env.update(REUSE_ENV)
    if import_tfcluster:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env
