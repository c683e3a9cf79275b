"""Checkpoints that do not race: on a cluster of several trainers only the chief writes where the program says.

A TF 2 program runs the same lines on every trainer, so an unchanged
``checkpoint.save(prefix)``, ``CheckpointManager.save()`` or
``model.save_weights(path)`` writes the same files from every worker at once.
TF's multi-worker tutorial has each non-chief write into a directory of its own
and delete it (the non-chief still saves: under ``MultiWorkerMirroredStrategy``
reading a variable to save it may be a collective every trainer joins);
tf-keras's ``ModelCheckpoint`` and ``BackupAndRestore`` do so already. Under TF2
mode the other writes do it too: a non-chief's write goes to a private
temporary directory that is removed once written, its bookkeeping (the
``checkpoint`` state file, a manager's list) is skipped, and the path it
returns is the chief's, so ``tf.train.latest_checkpoint(dir)`` on any trainer
names the chief's checkpoint.
"""

import contextlib
import os
import shutil
import tempfile

from ..core.patches import Patch, register
from ..topology.cluster import Cluster
from .strategies import trainers_spec


def writes_aside() -> bool:
    """True in a trainer that is not the chief of a cluster of several trainers: its checkpoints are private."""
    cluster = Cluster.from_environment()
    return trainers_spec(cluster) is not None and not cluster.is_chief


@contextlib.contextmanager
def _aside(path: str):
    """A path named like ``path`` in a private temporary directory, removed after the ``with``."""
    folder = tempfile.mkdtemp(prefix="tfcluster-checkpoint-")
    try:
        yield os.path.join(folder, os.path.basename(os.path.normpath(path)) or "checkpoint")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def checkpoint_write(original):
    """``Checkpoint._write``: a non-chief writes aside, without the state-file and manager callbacks."""
    def _write(self, file_prefix, options=None):
        if not writes_aside():
            return original(self, file_prefix, options=options)
        from tensorflow.python.checkpoint import checkpoint_options
        quiet = checkpoint_options.CheckpointOptions(
            experimental_io_device=getattr(options, "experimental_io_device", None))
        with _aside(os.fspath(file_prefix)) as private:
            original(self, private, options=quiet)
        return os.fspath(file_prefix)
    return _write


def save_weights(original):
    """tf-keras's ``Model.save_weights``: a non-chief saves aside (as ``ModelCheckpoint`` does)."""
    def save_weights(self, filepath, *args, **kwargs):
        if not writes_aside():
            return original(self, filepath, *args, **kwargs)
        with _aside(os.fspath(filepath)) as private:
            return original(self, private, *args, **kwargs)
    return save_weights


_WHY = "on a cluster of several trainers, a non-chief's checkpoint is written aside and removed: no race on the chief's"
register(Patch("tf2.checkpoint_aside", "tensorflow.python.checkpoint.checkpoint:Checkpoint._write", _WHY,
               checkpoint_write, "TF2 mode", params=("self", "file_prefix", "options")))
register(Patch("tf2.save_weights_aside", "tf_keras.src.engine.training:Model.save_weights", _WHY, save_weights,
               "TF2 mode, where tf-keras is installed", params=("self", "filepath"), optional=True))

#: The patches of this module TF2 mode installs.
PATCHES = ("tf2.checkpoint_aside", "tf2.save_weights_aside")
