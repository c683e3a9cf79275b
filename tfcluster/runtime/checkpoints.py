"""Checkpoint files: the chief's directory, finding a checkpoint, and the marker that training is done.

Checkpoints are TF's V2 format, written by the chief with paths relative to
their directory and no device inside them, so a single process restores them
(docs/pitfalls.md, item 9). After the final checkpoint the chief writes
:data:`DONE_MARKER`, which tells the evaluator that no checkpoint will follow.
"""

import json
import os
import tempfile
import time
from typing import Optional

from ..core.errors import SpecError, TfclusterError

#: The file the chief writes in the checkpoint dir after the final checkpoint.
DONE_MARKER = "tfcluster_done.json"
#: The prefix of every checkpoint tfcluster writes: ``model.ckpt-<global step>``.
CHECKPOINT_NAME = "model.ckpt"


def prepare_checkpoint_dir(checkpoint_dir: str):
    """Make the chief's checkpoint dir, or fail in one line before training, not at the first save."""
    try:
        os.makedirs(checkpoint_dir, exist_ok=True)
        # A dir that exists may still refuse files (read-only filesystem, permissions).
        with tempfile.TemporaryFile(dir=checkpoint_dir):
            pass
    except OSError as e:
        raise TfclusterError(f"cannot write checkpoint dir {checkpoint_dir}: {e.strerror}") from None
    try:
        os.remove(os.path.join(checkpoint_dir, DONE_MARKER))
    except FileNotFoundError:
        pass


def write_done_marker(checkpoint_dir: str, global_step: int, checkpoint: Optional[str]):
    """Say, atomically, that training ended at ``global_step`` with ``checkpoint`` as its last."""
    tmp = os.path.join(checkpoint_dir, DONE_MARKER + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"global_step": int(global_step), "checkpoint": checkpoint, "time": time.time()}, f)
    os.replace(tmp, os.path.join(checkpoint_dir, DONE_MARKER))


def read_done_marker(checkpoint_dir: str) -> Optional[dict]:
    """The chief's done marker in ``checkpoint_dir`` (global_step, checkpoint), or None."""
    try:
        with open(os.path.join(checkpoint_dir, DONE_MARKER), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def checkpoint_exists(prefix: str) -> bool:
    """True when a V2 checkpoint with this prefix is on disk (its index is written last)."""
    import tensorflow as tf
    return tf.io.gfile.exists(prefix + ".index")


def resolve_checkpoint(checkpoint: Optional[str]) -> str:
    """A checkpoint prefix from a prefix or a directory (its latest)."""
    import tensorflow as tf
    if checkpoint is None:
        raise SpecError("no checkpoint given: pass checkpoint= (a checkpoint dir or path)")
    if os.path.isdir(checkpoint):
        path = tf.train.latest_checkpoint(checkpoint)
        if path is None:
            raise SpecError(f"no checkpoint in {checkpoint}")
        return path
    if not checkpoint_exists(checkpoint):
        raise SpecError(f"checkpoint {checkpoint} does not exist")
    return checkpoint


def checkpoint_step(path: str) -> Optional[int]:
    """The global step stored in a checkpoint, or None when it has none."""
    import tensorflow as tf
    try:
        reader = tf.train.load_checkpoint(path)
        return int(reader.get_tensor("global_step")) if reader.has_tensor("global_step") else None
    except Exception:  # a checkpoint without a readable step is still evaluable
        return None


def checkpoints_in(checkpoint_dir: str) -> list:
    """Every checkpoint the dir's ``checkpoint`` file lists, oldest first, as absolute prefixes."""
    import tensorflow as tf
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    return [p if os.path.isabs(p) else os.path.join(checkpoint_dir, p) for p in paths]


def remove_checkpoint(prefix: str) -> list:
    """Remove the files of checkpoint ``prefix`` (its index and data); their names."""
    import glob
    removed = []
    for path in [prefix + ".index"] + glob.glob(glob.escape(prefix) + ".data-*"):
        try:
            os.remove(path)
            removed.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return removed


def remove_partial(checkpoint_dir: str, prefix: str) -> list:
    """Remove what a failed save of ``prefix`` left (its temp dir and files) unless the dir lists it; the names."""
    import glob
    import shutil
    if prefix in checkpoints_in(checkpoint_dir):
        return []
    removed = []
    for path in glob.glob(glob.escape(prefix) + ".*") + glob.glob(glob.escape(prefix) + "_temp*"):
        try:
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append(os.path.basename(path))
        except OSError:  # already gone, or the disk refuses even this: the next save tries again
            pass
    return removed


class CheckpointUnreadable(TfclusterError):
    """A checkpoint that vanished (rotated away) or cannot be read (truncated) while it was being restored."""


def restore_error(path: str, error) -> TfclusterError:
    """What a failed restore of ``path`` means: the checkpoint vanished or is unreadable, or it does not match."""
    from ..core.tferrors import summary
    kind = type(error).__name__
    if not checkpoint_exists(path):
        return CheckpointUnreadable(f"checkpoint {path} vanished while it was read (the chief rotated it away)")
    if kind in ("DataLossError", "OutOfRangeError") or (kind == "NotFoundError" and "Key " not in str(error)):
        return CheckpointUnreadable(f"checkpoint {path} cannot be read: {summary(error)}")
    return TfclusterError(f"checkpoint {path} does not match model_fn: {summary(error)}")
