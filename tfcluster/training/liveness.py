"""Is the chief still there? Its heartbeat on the ps, and workers that stop in one line when it is gone.

Only the chief initialises and saves. When it dies and is not restarted,
TF 1.x workers went on training what nobody would save, the ps waited forever
for the chief's done token, and a sync run waited out its stall timeout. Here
the chief beats a counter beside the global step every ``interval`` seconds,
from a thread of its own (a long sync wait does not silence it); every worker
reads it, between its steps and while a sync step waits, and when it has not
moved for ``timeout`` seconds the worker stops with :class:`ChiefLostError`,
naming the chief and its last checkpoint. A chief restarted in time
(``tfcluster local --max-restarts``) rejoins the live model and beats again.
"""

import logging
import threading
import time

from ..core.errors import ChiefLostError
from ..graph.step import Hook

log = logging.getLogger("tfcluster")

#: Seconds without the chief's heartbeat after which a worker stops (``chief_timeout_secs``).
CHIEF_TIMEOUT_SECS = 60.0


def heartbeat(train_graph, cluster, name: str, timeout: float = CHIEF_TIMEOUT_SECS, checkpoint_dir=None):
    """The :class:`ChiefHeartbeat` a trainer of ``cluster`` needs, or None where nobody could miss the chief.

    Only a cluster with ps tasks and several trainers has workers that train
    what the chief saves; a single trainer, or collective workers that each
    hold a copy, do not.
    """
    if cluster is None or not cluster.num_tasks("ps") or cluster.num_replicas < 2:
        return None
    return ChiefHeartbeat(train_graph, cluster.is_chief, name, str(cluster.chief_task), timeout,
                          checkpoint_dir=checkpoint_dir)


class ChiefHeartbeat(Hook):
    """The chief's heartbeat (on the chief), and the watch for it (on every other trainer)."""

    def __init__(self, train_graph, is_chief: bool, name: str, chief: str, timeout: float,
                 interval: float = 2.0, checkpoint_dir=None):
        self.train_graph, self.is_chief, self.name, self.chief = train_graph, is_chief, name, chief
        self.timeout, self.interval, self.checkpoint_dir = timeout, interval, checkpoint_dir
        self._session = self._thread = None
        self._stop = threading.Event()
        self._seen = (None, time.monotonic())
        self._next_look = 0.0

    def begin(self):
        """The counter beside the global step: state the chief creates, not part of the model."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        gs = self.train_graph.global_step
        with tf1.device(gs.device), tf1.name_scope("tfcluster_liveness"):
            beats = tf1.Variable(0, dtype=tf.int64, trainable=False, collections=[], name="chief_heartbeat",
                                 use_resource=True)
            self._beat = beats.assign_add(1, read_value=False)
            self._read = beats.read_value()
            self._options = tf1.RunOptions(timeout_in_ms=int(self.interval * 2000))
        self.train_graph.add_state(beats)
        if not self.is_chief:
            self.train_graph.runner.on_stall.append(self.check)

    def after_create_session(self, session, coord):
        """The chief (re)starts beating on the new session; a worker starts its watch afresh."""
        self._session = session
        self._seen = (None, time.monotonic())
        if self.is_chief and (self._thread is None or not self._thread.is_alive()):
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat_loop, name="tfcluster-chief-heartbeat", daemon=True)
            self._thread.start()

    def _beat_loop(self):
        while not self._stop.wait(self.interval):
            try:
                self._session.run(self._beat, options=self._options)
            except Exception as e:  # noqa: BLE001 - a lost session is the main thread's to recover
                log.debug("%s: heartbeat not sent (%s)", self.name, type(e).__name__)

    def after_run(self, run_context, run_values):
        """A worker looks at the heartbeat every ``interval`` seconds between its steps."""
        if not self.is_chief and time.monotonic() >= self._next_look:
            self._next_look = time.monotonic() + self.interval
            self.check()

    def check(self):
        """Raise ChiefLostError when the heartbeat has not moved for ``timeout`` seconds."""
        import tensorflow as tf
        now = time.monotonic()
        try:
            value = int(self._session.run(self._read, options=self._options))
        except tf.errors.OpError:
            return      # the ps, not the chief: the session's own recovery deals with it
        last, since = self._seen
        if value != last:
            self._seen = (value, now)
            return
        if now - since >= self.timeout:
            from ..runtime.checkpoints import checkpoints_in
            latest = ""       # a worker that does not know the chief's checkpoint dir says nothing of it
            if self.checkpoint_dir:
                ckpts = checkpoints_in(self.checkpoint_dir)
                latest = f"; its last checkpoint is {ckpts[-1]}" if ckpts else "; it wrote no checkpoint"
            raise ChiefLostError(f"{self.name}: the chief ({self.chief}) has not been heard from for {now - since:.0f}s "
                                 f"(chief_timeout_secs={self.timeout:g}): nobody saves the model any more, so this "
                                 f"worker stops{latest}. Restart the chief to go on (tfcluster local "
                                 "--max-restarts restarts it, and it rejoins the live model)")

    def end(self, session):
        """The chief stops beating."""
        self._stop.set()
