"""A tf-keras model's checkpoints, written and read by tf-keras, named and kept as every tfcluster checkpoint.

The training session and its checkpoint hook save and restore through a
``tf.compat.v1.train.Saver``'s two calls (``save``, ``restore``).
:class:`KerasSaver` answers them with the model's own ``save_weights`` and
``load_weights``, so the files are tf-keras's object-based format, which
``model.load_weights`` reads in one process. A ``Saver``'s name-based files
are not: in graph mode tf-keras refuses them ("Streaming restore not
supported from name-based checkpoints when graph building"). The files are
named ``model.ckpt-<update>``, listed in the directory's ``checkpoint`` file,
and the newest ``max_to_keep`` are kept, as ``fit``'s and the Estimator's are.
"""

import logging
import os

from ..runtime.checkpoints import checkpoints_on_disk, remove_checkpoint

log = logging.getLogger("tfcluster")


class KerasSaver:
    """``save`` / ``restore`` of a ``Saver``, done by the tf-keras ``model`` (see the module doc)."""

    def __init__(self, model, checkpoint_dir: str, max_to_keep: int = 5):
        self.model, self.checkpoint_dir, self.max_to_keep = model, checkpoint_dir, max_to_keep
        # A restarted chief knows the checkpoints written before it, so rotation keeps exactly max_to_keep.
        self.kept = checkpoints_on_disk(checkpoint_dir)

    def recover_last_checkpoints(self, paths):
        """Rotate ``paths`` (oldest first) with the checkpoints this saver writes, as a ``Saver`` does."""
        self.kept = list(paths)

    def save(self, session, prefix: str, global_step: int, write_meta_graph: bool = False) -> str:
        """Write ``<prefix>-<global_step>`` with ``session``; list it, and remove the oldest beyond ``max_to_keep``."""
        import tensorflow as tf
        path = f"{prefix}-{int(global_step)}"
        with session.graph.as_default(), session.as_default():
            self.model.save_weights(path)
        self.kept = [p for p in self.kept if p != path] + [path]
        while self.max_to_keep and len(self.kept) > self.max_to_keep:
            old = self.kept.pop(0)
            try:
                remove_checkpoint(old)
            except OSError as e:   # an old file that cannot go stays (the disk refuses even this)
                log.debug("could not remove checkpoint %s: %s", old, e)
        # tf-keras lists only the checkpoint it wrote: list every kept one, as a Saver does.
        tf.compat.v1.train.update_checkpoint_state(self.checkpoint_dir, os.path.basename(path),
                                                   [os.path.basename(p) for p in self.kept])
        return path

    def restore(self, session, path: str):
        """Load ``path`` into the model's variables through ``session``; an unreadable file raises TF's error for it,
        as a ``Saver`` does (training/chief.py then tries an older checkpoint)."""
        import tensorflow as tf
        with session.graph.as_default(), session.as_default():
            try:
                self.model.load_weights(path)
            except IndexError as e:     # the checkpoint reader's OUT_OF_RANGE (a truncated file), as Python has it
                raise tf.errors.OutOfRangeError(None, None, str(e)) from None
