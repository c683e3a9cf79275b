"""Where each trainer's input stands, saved beside the checkpoints, so a resumed run reads on from there.

TF 1.x's programs restarted every input pipeline from its start after a
restart, so each preemption fed the early examples again and a job preempted
often never saw the end of its data (README, "When a task fails"). Here each
trainer saves its iterator's state (TF's own iterator checkpointing, as
``tf.data.experimental.make_saveable_from_iterator`` gives it) in
``<checkpoint dir>/input/<task>/position-<global step>``: after its first
step (which finds out whether the pipeline can be saved: a Python generator
cannot, and one line says so), on the checkpoint cadence, and at its end,
finished or stopped by a SIGTERM.

A position is named by the global step read after the trainer's last step
before it, so every example before it is in any model at that step or later.
On each new session the trainer restores the newest position at or below the
model's global step: after a crash it replays the examples since (never skips
one); after a SIGTERM the chief's final save waits for every trainer's last
step (:class:`~tfcluster.training.hooks.TrainersDone`), so the resumed run
reads each example exactly as often as an uninterrupted one.

Stateful functions in the pipeline (``py_function`` in a ``map``, an unseeded
random op) run again from their own start: what is saved is the position.
"""

import logging
import os
from typing import Optional

from ..core.tferrors import summary
from ..graph.step import Hook
from ..runtime.checkpoints import checkpoints_on_disk, step_in_name
from .timer import Every

log = logging.getLogger("tfcluster")

#: The folder, inside the checkpoint dir, that holds every trainer's saved input positions.
INPUT_DIR = "input"
#: The prefix of a saved position: ``position-<global step>``.
POSITION_NAME = "position"
#: What TF raises for a pipeline it cannot save (a generator) or a saved position that does not fit this one.
_CANNOT = ("UnimplementedError", "FailedPreconditionError", "InvalidArgumentError", "NotFoundError",
           "DataLossError", "OutOfRangeError")


def position_dir(checkpoint_dir: str, name: str) -> str:
    """Where trainer ``name`` (``worker:1``, ``local``) keeps its input positions."""
    return os.path.join(checkpoint_dir, INPUT_DIR, name.replace(":", "-"))


class InputPositionHook(Hook):
    """Saves this trainer's input position on the checkpoint cadence and restores it on each session (module doc).

    ``keep``: positions kept; a few more than the checkpoints, since the
    trainer's saves and the chief's are not at the same steps.
    """

    def __init__(self, iterator, checkpoint_dir: str, global_step, name: str, *, save_steps: Optional[int] = None,
                 save_secs: Optional[float] = 60.0, keep: int = 5):
        self.iterator, self.dir, self.global_step_tensor, self.name = iterator, position_dir(checkpoint_dir, name), \
            global_step, name
        self.keep = keep
        self._every = Every(steps=save_steps, secs=save_secs or None)
        self.saveable = True        # False once the pipeline turned out unsaveable (said once, at the start)
        self.restored: Optional[str] = None
        self._step = None
        self._saved_step = None

    def begin(self):
        """The Saver of this trainer's iterator, on the iterator's device (its files are this host's)."""
        import tensorflow as tf
        from tensorflow.python.util import deprecation
        tf1 = tf.compat.v1
        with tf1.device(self.iterator.initializer.device), deprecation.silence():
            # "ignore": a map's py_function is run again after a restore; only a generator cannot be saved.
            saveable = tf1.data.experimental.make_saveable_from_iterator(self.iterator,
                                                                        external_state_policy="ignore")
            self.saver = tf1.train.Saver([saveable], max_to_keep=self.keep, save_relative_paths=True,
                                         name="tfcluster_input_position")
        self._read = self.global_step_tensor.read_value()

    def after_create_session(self, session, coord):
        """Restore the newest position at or below the model's step."""
        self._step = int(session.run(self._read))
        self._restore(session, self._step)

    def _restore(self, session, step: int):
        on_disk = checkpoints_on_disk(self.dir)
        later = [p for p in on_disk if step_in_name(p) > step]
        for path in later:      # another history's (the model went back to an older checkpoint): never to be read
            _remove(path)
        usable = [p for p in on_disk if p not in later]
        for path in reversed(usable):
            try:
                self.saver.restore(session, path)
            except Exception as e:  # noqa: BLE001 - only a position that cannot be read is skipped
                if type(e).__name__ not in _CANNOT:
                    raise
                # TF's Saver puts its own advice about variables first; the iterator's reason is the one to name.
                log.warning("%s: input position %s does not fit this input pipeline or cannot be read (%s); "
                            "trying an older one", self.name, path, summary(e, prefer="Failed to restore"))
                session.run(self.iterator.initializer)        # a restore that failed may leave it at its end
                continue
            self.restored = path
            log.info("%s resumes its input where it stood at global step %d", self.name, step_in_name(path))
            break
        else:
            if step > 0:
                log.info("%s reads its input from the start (no saved position at or below global step %d)",
                         self.name, step)
        # The Saver rotates what it knows: every position on disk, so a restart keeps exactly ``keep``.
        self.saver.recover_last_checkpoints([os.path.join(self.dir, os.path.basename(p)) for p in usable])

    def _save(self, session, step: int, first: bool = False):
        if not self.saveable:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            self.saver.save(session, os.path.join(self.dir, POSITION_NAME), global_step=step,
                            write_meta_graph=False)
            self._saved_step = step
        except Exception as e:  # noqa: BLE001 - a position not saved costs replayed examples, never the run
            if type(e).__name__ not in _CANNOT + ("ResourceExhaustedError",) and not isinstance(e, OSError):
                raise
            if first:        # a generator's iterator is made, and found unsaveable, at the first step
                self.saveable = False
                log.warning("%s: its input pipeline cannot be saved (%s); a resumed run reads it from its start",
                            self.name, summary(e))
            else:
                log.warning("%s could not save its input position at global step %d (%s); training goes on",
                            self.name, step, summary(e))

    def after_run(self, run_context, run_values):
        """Save after the first step (which finds out whether the pipeline can be saved), then on the cadence."""
        first, self._step = self._saved_step is None and self.saveable, run_values.global_step
        if first or self._every.due(self._step):
            self._every.mark(self._step)
            run_context.call(lambda s: self._save(s, self._step, first=first))

    def end(self, session):
        """The position after this trainer's last step, before the chief's final save reads the global step."""
        if self._step is not None and self._step != self._saved_step:
            self._save(session, self._step)


def _remove(prefix: str):
    import glob
    for path in glob.glob(glob.escape(prefix) + ".*"):
        try:
            os.remove(path)
        except OSError:
            pass


def input_position(iterator, checkpoint_dir: Optional[str], global_step, name: str, **options) -> list:
    """``[InputPositionHook(...)]`` where there is a checkpoint dir to save positions in, else ``[]``.

    ``iterator`` None: the input is tensors (queue runners, placeholders), whose position no one can save.
    """
    if not checkpoint_dir:
        return []
    if iterator is None:
        log.info("%s: its input is tensors, not a tf.data.Dataset, so its position cannot be saved; a resumed run "
                 "reads it from its start", name)
        return []
    return [InputPositionHook(iterator, checkpoint_dir, global_step, name, **options)]
