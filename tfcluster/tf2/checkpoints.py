"""Checkpoints and SavedModels that do not race: on a cluster of several trainers only the chief writes where the program says.

A TF 2 program runs the same lines on every trainer, so an unchanged
``checkpoint.save(prefix)``, ``CheckpointManager.save()``,
``model.save_weights(path)``, ``model.save(path)`` or
``tf.saved_model.save(obj, path)`` writes the same files from every worker at
once (two SavedModels in one directory: TF's ``MergeV2Checkpoints ... not
found``). TF's multi-worker tutorials have each non-chief write into a directory
of its own and delete it (the non-chief still saves: under
``MultiWorkerMirroredStrategy`` reading a variable to save it may be a
collective every trainer joins); tf-keras's ``ModelCheckpoint`` and
``BackupAndRestore`` do so already. Under TF2 mode the other writes do it too:
a non-chief's write goes to a private temporary directory that is removed once
written, its bookkeeping (the ``checkpoint`` state file, a manager's list) is
skipped, and the path it returns is the chief's, so
``tf.train.latest_checkpoint(dir)`` on any trainer names the chief's
checkpoint. The non-chief's call returns once the chief's write of that path is
complete (a key in TF's coordination service; the chief's n-th write from a
line of code answers a non-chief's n-th from it), so what the program reads next
(``load_model(path)``, the latest checkpoint) is the chief's whole write.

A path the program already made a non-chief's own is left alone: one with a
directory named ``workertemp_<task index>``, TF's tutorials' and tf-keras's
name for it (``distributed_file_utils``: ``ModelCheckpoint``, ``BackupAndRestore``).
Those programs remove it themselves. The call still returns once the chief's
write from the same line of code is whole: TF's Keras tutorial loads
``tf.train.latest_checkpoint(dir)`` on every worker after ``fit``, and a
non-chief read the chief's checkpoint of the epoch before while the chief still
wrote the last (CI: the two workers' weights differed).
"""

import collections
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import Optional

from ..core.patches import Patch, register
from ..topology.cluster import Cluster
from .strategies import trainers_spec

log = logging.getLogger("tfcluster")

#: Seconds a non-chief that wrote waits at most for the chief's write of the same line to be complete.
CHIEF_WRITE_WAIT_SECS = 600

_local = threading.local()          # inside a write already decided: a writer it calls writes as told
_writes = collections.Counter()     # outermost writes made from each line of code by this process, in order
#: Frames that are no program's line: tfcluster's, TensorFlow's, contextlib's (the writer's own call chain).
_NOT_CALLERS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, contextlib.__file__)


def programs_own(path: str, index: int) -> bool:
    """True when ``path`` is already a non-chief's own: it has a directory ``workertemp_<index>`` (see the module)."""
    return f"workertemp_{index}" in os.path.normpath(path).split(os.sep)


def _call_site() -> str:
    """``file:line:function`` of the code that asked for the write: the first frame outside tfcluster and TensorFlow.

    Every trainer runs the same lines, so the chief's n-th write from a line is the one a
    non-chief's n-th write from that line waits for, whatever either path is (tf-keras's
    ``BackupAndRestore`` writes the chief's under ``chief/``, a non-chief's under ``workertemp_1/``).
    """
    import tensorflow as tf
    skip = _NOT_CALLERS + (os.path.dirname(os.path.abspath(tf.__file__)) + os.sep,)
    frame = sys._getframe(1)
    # Keras's traceback filter wraps every public method: its frame is no caller either.
    while frame is not None and (frame.f_code.co_filename.startswith(skip)
                                 or frame.f_code.co_filename.endswith("traceback_utils.py")):
        frame = frame.f_back
    if frame is None:
        return "?"
    # The file's name, not its path: the trainers' machines may hold the program (and tf-keras) in other folders.
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}:{frame.f_code.co_name}"


def _coordination():
    """TF's context when its coordination service runs (the strategy's server started), else None."""
    from tensorflow.python.eager import context
    ctx = context.context()
    if not ctx._initialized or ctx._collective_ops_server_def is None or ctx.coordination_service is None:
        return None
    return ctx


def _key(site: str, count: int) -> str:
    return f"tfcluster/wrote/{site}#{count}"


def _chief_wrote(site: str, count: int, path: str) -> None:
    """Say the chief's ``count``-th write from ``site`` (to ``path``) is complete, to a non-chief waiting for it."""
    ctx = _coordination()
    if ctx is not None:
        ctx.set_config_key_value(_key(site, count), path)


def _wait_for_chief(site: str, count: int, path: str) -> None:
    """Return once the chief's ``count``-th write from ``site`` is complete, or after CHIEF_WRITE_WAIT_SECS."""
    ctx = _coordination()
    if ctx is None:
        return
    from tensorflow.python.framework import errors
    try:
        ctx.get_config_key_value(_key(site, count), timeout_in_ms=CHIEF_WRITE_WAIT_SECS * 1000)
    except errors.DeadlineExceededError:
        log.warning("the chief did not write %s within %ds: going on without it (what the program reads there "
                    "may be older)", path, CHIEF_WRITE_WAIT_SECS)
    except errors.OpError:
        # The chief ended its run and took TF's coordination service with it: its writes were done by then (a
        # chief that failed instead is named at the next all-reduce, tfcluster.tf2.faults).
        pass


@contextlib.contextmanager
def where_to_write(cluster: Optional[Cluster], path: str):
    """The path this trainer writes ``path``'s files at: ``path`` itself, or None, or a private one (see the module).

    None means the files go to ``path`` as the program asked; a private path means a
    non-chief's write aside, removed after the ``with``. A write inside another (``save_weights``
    calls ``Checkpoint.write``) is told None: the outer one decided.
    """
    if getattr(_local, "deciding", False):
        yield None
        return
    _local.deciding = True
    try:
        if trainers_spec(cluster) is None:
            yield None
            return
        site = _call_site()
        count = _writes[site] = _writes[site] + 1
        if cluster.is_chief:
            yield None
            _chief_wrote(site, count, path)
            return
        if programs_own(path, cluster.task.index):
            yield None
        else:
            folder = tempfile.mkdtemp(prefix="tfcluster-checkpoint-")
            try:
                yield os.path.join(folder, os.path.basename(os.path.normpath(path)) or "checkpoint")
            finally:
                shutil.rmtree(folder, ignore_errors=True)
        _wait_for_chief(site, count, path)
    finally:
        _local.deciding = False


def checkpoint_write(original, cluster):
    """``Checkpoint._write``: a non-chief of ``cluster`` writes aside, without the state-file and manager callbacks."""
    def _write(self, file_prefix, options=None):
        with where_to_write(cluster, os.fspath(file_prefix)) as private:
            if private is None:
                return original(self, file_prefix, options=options)
            from tensorflow.python.checkpoint import checkpoint_options
            quiet = checkpoint_options.CheckpointOptions(
                experimental_io_device=getattr(options, "experimental_io_device", None))
            original(self, private, options=quiet)
        return os.fspath(file_prefix)
    return _write


def save_weights(original, cluster):
    """tf-keras's ``Model.save_weights``: a non-chief saves aside (as ``ModelCheckpoint`` does)."""
    def save_weights(self, filepath, *args, **kwargs):
        with where_to_write(cluster, os.fspath(filepath)) as private:
            return original(self, filepath if private is None else private, *args, **kwargs)
    return save_weights


def saved_model(original, cluster):
    """``save_and_return_nodes`` (``tf.saved_model.save``, tf-keras's ``model.save``): a non-chief exports aside."""
    def save_and_return_nodes(obj, export_dir, *args, **kwargs):
        with where_to_write(cluster, os.fspath(export_dir)) as private:
            return original(obj, export_dir if private is None else private, *args, **kwargs)
    return save_and_return_nodes


_WHY = "on a cluster of several trainers, a non-chief's checkpoint is written aside and removed: no race on the chief's"
register(Patch("tf2.checkpoint_aside", "tensorflow.python.checkpoint.checkpoint:Checkpoint._write", _WHY,
               checkpoint_write, "TF2 mode", params=("self", "file_prefix", "options")))
register(Patch("tf2.save_weights_aside", "tf_keras.src.engine.training:Model.save_weights", _WHY, save_weights,
               "TF2 mode, where tf-keras is installed", params=("self", "filepath"), optional=True))

def keras_saved_model(original, cluster):
    """tf-keras's SavedModel ``save``: a non-chief exports aside, with the ``keras_metadata.pb`` written after it."""
    def save(model, filepath, *args, **kwargs):
        with where_to_write(cluster, os.fspath(filepath)) as private:
            return original(model, filepath if private is None else private, *args, **kwargs)
    return save


register(Patch("tf2.keras_saved_model_aside", "tf_keras.src.saving.legacy.saved_model.save:save",
               "on a cluster of several trainers, a non-chief's Keras SavedModel (and the metadata tf-keras writes "
               "after it) is written aside and removed", keras_saved_model, "TF2 mode, where tf-keras is installed",
               params=("model", "filepath"), optional=True))
register(Patch("tf2.saved_model_aside", "tensorflow.python.saved_model.save:save_and_return_nodes",
               "on a cluster of several trainers, a non-chief's SavedModel is written aside and removed: no race on "
               "the chief's", saved_model, "TF2 mode", params=("obj", "export_dir")))

#: The patches of this module TF2 mode installs, each given the process's cluster (or None).
PATCHES = ("tf2.checkpoint_aside", "tf2.save_weights_aside", "tf2.keras_saved_model_aside", "tf2.saved_model_aside")
