"""Checkpoint files: the chief's directory, finding a checkpoint, and the marker that training is done.

Checkpoints are TF's V2 format, written by the chief with paths relative to
their directory and no device inside them, so a single process restores them
(docs/pitfalls.md, item 9). After the final checkpoint the chief writes
:data:`DONE_MARKER`, which tells the evaluator that no checkpoint will follow.
"""

import contextlib
import json
import logging
import os
import re
import tempfile
import time
from typing import Optional

from ..core.errors import CheckpointUnreadable, NoReadableCheckpoint, SpecError, TfclusterError

#: The file the chief writes in the checkpoint dir after the final checkpoint.
DONE_MARKER = "tfcluster_done.json"
#: The prefix of every checkpoint tfcluster writes: ``model.ckpt-<global step>``.
CHECKPOINT_NAME = "model.ckpt"
#: Where a chief moves the checkpoints it cannot read (beside them): kept as evidence, out of the rotation.
UNREADABLE_DIR = "unreadable"

log = logging.getLogger("tfcluster")
_said = set()       # the unreadable state files already named: each once, though they are read on every poll


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
    """The chief's done marker in ``checkpoint_dir`` (global_step, checkpoint), or None.

    A marker that cannot be read (truncated, empty, not tfcluster's JSON) is
    taken as absent, said once: whoever waits for it goes on waiting, bounded.
    """
    path = os.path.join(checkpoint_dir, DONE_MARKER)
    try:
        with open(path, encoding="utf-8") as f:
            marker = json.load(f)
        if not isinstance(marker, dict) or not isinstance(marker.get("global_step"), int):
            raise ValueError("no global_step in it")
        return marker
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        _warn_once(path, "%s cannot be read (%s); taken as absent", path, e)
        return None


def _warn_once(key: str, message: str, *args):
    if key not in _said:
        _said.add(key)
        log.warning(message, *args)


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


@contextlib.contextmanager
def pinned(prefix: str):
    """``prefix``'s files hard-linked into a private folder beside them for as long as they are read; yields the
    pinned prefix, or ``prefix`` itself where links cannot be made (another file system, a file already gone).

    The chief keeps its last few checkpoints and deletes older ones; an evaluator slower than that many saves read
    every checkpoint after it was deleted and evaluated none. A link keeps the files' data until it goes too.
    """
    import glob
    import shutil
    files = glob.glob(glob.escape(prefix) + ".*")
    pin_dir = None
    if prefix + ".index" in files:
        try:
            pin_dir = tempfile.mkdtemp(prefix=".tfcluster-reading-", dir=os.path.dirname(prefix))
            for f in files:
                os.link(f, os.path.join(pin_dir, os.path.basename(f)))
        except OSError:
            if pin_dir is not None:
                shutil.rmtree(pin_dir, ignore_errors=True)
            pin_dir = None
    try:
        yield prefix if pin_dir is None else os.path.join(pin_dir, os.path.basename(prefix))
    finally:
        if pin_dir is not None:
            shutil.rmtree(pin_dir, ignore_errors=True)


def checkpoints_in(checkpoint_dir: str) -> list:
    """Every checkpoint the dir's ``checkpoint`` file lists, oldest first, as absolute prefixes.

    A state file that cannot be parsed lists nothing (:func:`checkpoints_on_disk` still finds the files).
    """
    import tensorflow as tf
    try:
        state = tf.train.get_checkpoint_state(checkpoint_dir)
    except (tf.errors.OpError, ValueError) as e:     # a truncated or garbled text proto
        _warn_once(os.path.join(checkpoint_dir, "checkpoint"), "the checkpoint state file in %s cannot be read "
                   "(%s: %s); looking at the files on disk", checkpoint_dir, type(e).__name__,
                   str(e).splitlines()[0][:120] if str(e) else "")
        return []
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    return [p if os.path.isabs(p) else os.path.join(checkpoint_dir, p) for p in paths]


def step_in_name(prefix: str) -> int:
    """The step a ``<name>-<step>`` prefix is named by (-1 when none): what sorts checkpoints without reading them."""
    m = re.search(r"-(\d+)$", prefix)
    return int(m.group(1)) if m else -1


def checkpoints_on_disk(checkpoint_dir: str) -> list:
    """Every checkpoint in ``checkpoint_dir``, oldest first (by step, then time), as absolute prefixes.

    The state file's list and every other ``<name>-<step>.index`` beside it: a
    restarted run's Saver lists only what it saved itself (README, "When a task fails").
    """
    import glob
    if not os.path.isdir(checkpoint_dir):
        return []
    found = [p[:-len(".index")] for p in glob.glob(os.path.join(glob.escape(checkpoint_dir), "*-*.index"))]
    listed = [p for p in checkpoints_in(checkpoint_dir) if checkpoint_exists(p)]
    paths = list(dict.fromkeys(os.path.normpath(os.path.abspath(p)) for p in listed + found))

    def mtime(p):
        try:
            return os.path.getmtime(p + ".index")
        except OSError:
            return 0.0
    return sorted(paths, key=lambda p: (step_in_name(p), mtime(p)))


def set_aside(prefix: str) -> str:
    """Move checkpoint ``prefix``'s files into :data:`UNREADABLE_DIR` beside it, out of every rotation; the dir."""
    import glob
    aside = os.path.join(os.path.dirname(prefix), UNREADABLE_DIR)
    os.makedirs(aside, exist_ok=True)
    for path in [prefix + ".index"] + glob.glob(glob.escape(prefix) + ".data-*"):
        try:
            os.replace(path, os.path.join(aside, os.path.basename(path)))
        except FileNotFoundError:
            pass
    return aside


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


def restore_error(path: str, error) -> TfclusterError:
    """What a failed restore of ``path`` means: the checkpoint vanished or is unreadable, or it does not match."""
    from ..core.tferrors import summary
    kind = type(error).__name__
    if not checkpoint_exists(path):
        return CheckpointUnreadable(f"checkpoint {path} vanished while it was read (the chief rotated it away)")
    if kind in ("DataLossError", "OutOfRangeError") or (kind == "NotFoundError" and "Key " not in str(error)):
        return CheckpointUnreadable(f"checkpoint {path} cannot be read: {summary(error)}")
    return TfclusterError(f"checkpoint {path} does not match model_fn: {summary(error)}")
