"""How the chief gets its model on each session: join the live one, restore a readable checkpoint, or initialise.

TF 1.x's chief restored its latest checkpoint every time it made a session,
so a chief restarted over live ps tasks rolled every worker back to that
checkpoint, and a truncated latest checkpoint stopped it with a traceback
although an older one was intact. Here, in order:

1. the ps tasks still hold the model (every variable initialised): the chief
   joins it as it stands, and nobody rolls back;
2. else the newest checkpoint that reads: a newer one that does not (a
   truncated file, a save cut short) is named in a warning and skipped;
3. else the model is initialised, and a chief that has trained before says
   that training starts over, since the ps lost the model before any save.
"""

import logging

from ..core.tferrors import summary
from ..runtime.checkpoints import checkpoints_in

log = logging.getLogger("tfcluster")

#: What a checkpoint that cannot be read raises while it is restored.
_UNREADABLE = ("DataLossError", "OutOfRangeError", "NotFoundError", "InvalidArgumentError", "UnknownError")


class ChiefStart:
    """The chief's way to a ready session; :meth:`create` says what it did in ``what`` and ``restored_from``."""

    def __init__(self, graph, target, config, init_op, ready_op, model_ready_op, local_init_op, saver=None,
                 checkpoint_dir=None, init_fn=None, init_feed_dict=None, name="chief"):
        self.graph, self.target, self.config = graph, target, config
        self.init_op, self.ready_op, self.model_ready_op = init_op, ready_op, model_ready_op
        self.local_init_op = local_init_op
        self.saver, self.checkpoint_dir = saver, checkpoint_dir
        self.init_fn, self.init_feed_dict, self.name = init_fn, init_feed_dict, name
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
            elif not self._restore(session):
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

    def _model_is_live(self, session) -> bool:
        return len(session.run(self.model_ready_op)) == 0

    def _restore(self, session) -> bool:
        """Restore the newest readable checkpoint; False when there is none."""
        if self.saver is None or not self.checkpoint_dir:
            return False
        skipped = []
        for path in reversed(checkpoints_in(self.checkpoint_dir)):
            try:
                self.saver.restore(session, path)
            except Exception as e:  # noqa: BLE001 - only an unreadable checkpoint is skipped
                if type(e).__name__ not in _UNREADABLE:
                    raise
                log.warning("%s: checkpoint %s cannot be read (%s); trying an older one", self.name, path,
                            summary(e))
                skipped.append(path)
                continue
            self.what, self.restored_from = f"restored the model from {path}", path
            if skipped:
                log.warning("%s restored %s instead of the newest checkpoint, %s, which cannot be read", self.name,
                            path, skipped[0])
            return True
        if skipped:
            log.warning("%s: no checkpoint in %s can be read (the newest: %s); initialising the model", self.name,
                        self.checkpoint_dir, skipped[0])
        return False

    def _initialise(self, session):
        session.run(self.init_op, feed_dict=self.init_feed_dict)
        if self.init_fn is not None:
            self.init_fn(session)
        self.restored_from = None
        if self.sessions > 1:
            log.warning("%s: the ps tasks lost the model before any checkpoint was written: initialising it "
                        "again, and training starts over from global step 0", self.name)
            self.what = "initialised the model again"
        else:
            self.what = "initialised the model"
