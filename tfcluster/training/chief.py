"""How the chief gets its model on each session: join the live one, restore a readable checkpoint, or initialise.

TF 1.x's chief restored its latest checkpoint every time it made a session,
so a chief restarted over live ps tasks rolled every worker back to that
checkpoint, and a truncated latest checkpoint stopped it with a traceback
although an older one was intact. Here, in order:

1. the ps tasks still hold the model (every variable initialised): the chief
   joins it as it stands, and nobody rolls back;
2. else the newest checkpoint on disk that reads (every one in the dir, not
   only the state file's list, which a restarted run rewrites): a newer one
   that does not (a truncated file, a save cut short) is named in a warning
   and moved to ``unreadable/`` beside it, kept but out of the rotation; the
   Saver is told every readable one, so ``max_to_keep`` holds across restarts;
3. else, when the dir holds checkpoints and none reads, the run stops in one
   line naming each and its error (exit 2), unless TFCLUSTER_START_OVER=1
   says to move them aside and start over: never a silent re-initialisation;
4. else the model is initialised, and a chief that has trained before says
   that training starts over, since the ps lost the model before any save.
"""

import logging
import os

from ..core import environment
from ..core.checks import switch_from
from ..core.tferrors import summary
from ..runtime.checkpoints import UNREADABLE_DIR, NoReadableCheckpoint, checkpoints_on_disk, set_aside

log = logging.getLogger("tfcluster")

#: What a checkpoint that cannot be read raises while it is restored.
_UNREADABLE = ("DataLossError", "OutOfRangeError", "NotFoundError", "InvalidArgumentError", "UnknownError")


class ChiefStart:
    """The chief's way to a ready session; :meth:`create` says what it did in ``what`` and ``restored_from``."""

    def __init__(self, graph, target, config, init_op, ready_op, model_ready_op, local_init_op, saver=None,
                 checkpoint_dir=None, init_fn=None, init_feed_dict=None, name="chief", hooks_init=None):
        self.graph, self.target, self.config = graph, target, config
        self.init_op, self.ready_op, self.model_ready_op = init_op, ready_op, model_ready_op
        self.local_init_op = local_init_op
        self.saver, self.checkpoint_dir = saver, checkpoint_dir
        self.init_fn, self.init_feed_dict, self.name = init_fn, init_feed_dict, name
        self.hooks_init = hooks_init        # the hooks' own variables, which checkpoints do not hold
        self.what = self.restored_from = None
        self.sessions = 0

    def _session(self):
        import tensorflow as tf
        return tf.compat.v1.Session(self.target, graph=self.graph, config=self.config)

    def create(self):
        """A session whose model is ready (and local state initialised); see the module doc."""
        self.sessions += 1
        session = self._session()
        try:
            if self.target and self._model_is_live(session):
                self.what, self.restored_from = "joined the model the ps tasks hold", None
            elif self._restore(session):
                if self.hooks_init is not None:
                    session.run(self.hooks_init)
            else:
                self._initialise(session)
            session.run(self.local_init_op)
            missing = session.run(self.ready_op)
            if len(missing):
                raise RuntimeError(f"{self.name}: the model is not ready after initialisation: "
                                   f"{', '.join(m.decode() for m in missing[:5])} uninitialised")
        except BaseException:
            session.close()
            raise
        return session

    def _run_init(self, session):
        session.run(self.init_op, feed_dict=self.init_feed_dict)
        if self.init_fn is not None:
            self.init_fn(session)

    def _model_is_live(self, session) -> bool:
        return len(session.run(self.model_ready_op)) == 0

    def _restore(self, session) -> bool:
        """Restore the newest readable checkpoint on disk; False when there is none (module doc, 2 and 3)."""
        if self.saver is None or not self.checkpoint_dir:
            return False
        on_disk = checkpoints_on_disk(self.checkpoint_dir)
        unreadable, restored = [], None
        for path in reversed(on_disk):
            try:
                self.saver.restore(session, path)
            except Exception as e:  # noqa: BLE001 - only an unreadable checkpoint is skipped
                if type(e).__name__ not in _UNREADABLE:
                    raise
                log.warning("%s: checkpoint %s cannot be read (%s); trying an older one", self.name, path,
                            summary(e))
                unreadable.append((path, summary(e)))
                continue
            restored = path
            break
        if unreadable and restored is None and not switch_from(environment.START_OVER, False):
            raise NoReadableCheckpoint(_none_readable(self.name, self.checkpoint_dir, unreadable))
        aside = [set_aside(path) for path, _ in unreadable]
        # The Saver rotates what it knows: every readable checkpoint on disk, so a restart keeps exactly max_to_keep.
        bad = {path for path, _ in unreadable}
        recover = getattr(self.saver, "recover_last_checkpoints", None)
        if recover is not None:
            # named as the saver names its own saves (the dir as given, relative or not), so none is listed twice
            recover([os.path.join(self.checkpoint_dir, os.path.basename(p)) for p in on_disk if p not in bad])
        if restored is None:
            if unreadable:
                log.warning("%s: no checkpoint in %s can be read; %s=1: moved %d of them to %s and initialising the "
                            "model", self.name, self.checkpoint_dir, environment.START_OVER, len(unreadable),
                            aside[0])
            return False
        self.what, self.restored_from = f"restored the model from {restored}", restored
        if unreadable:
            log.warning("%s restored %s instead of the newest checkpoint, %s, which cannot be read (moved to %s)",
                        self.name, restored, unreadable[0][0], aside[0])
        return True

    def _initialise(self, session):
        if self.target:
            # In a session of its own, closed once done: a session keeps the executors of every step it ran, on
            # the ps for its whole life, and the initialising step's hold its initial values' constants, each as
            # big as its variable (an Adagrad slot's constant_initializer(0.1); the zeros fills Grappler folds).
            # Closing it gives them back: 166 MB of a 332 MB table with its Adagrad slot (docs/memory.md).
            with self._session() as init_session:
                self._run_init(init_session)
        else:
            self._run_init(session)     # one process: the variables live in this session
        self.restored_from = None
        if self.sessions > 1:
            log.warning("%s: the ps tasks lost the model before any checkpoint was written: initialising it "
                        "again, and training starts over from global step 0", self.name)
            self.what = "initialised the model again"
        else:
            self.what = "initialised the model"


def _none_readable(name: str, checkpoint_dir: str, unreadable: list) -> str:
    listed = "; ".join(f"{os.path.basename(path)} ({error})" for path, error in unreadable)
    return (f"{name}: no checkpoint in {checkpoint_dir} can be read, so training would start over: {listed}. "
            f"None was moved or deleted; set {environment.START_OVER}=1 to move them to "
            f"{os.path.join(checkpoint_dir, UNREADABLE_DIR)} and start from step 0")
