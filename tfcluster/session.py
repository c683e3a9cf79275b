"""The training session: chief and non-chief roles, fast readiness, bounded recovery.

The chief initialises the model (or restores the latest checkpoint) and the
shared state strategies keep out of checkpoints; the other workers wait for it,
polling every ``poll_secs`` (0.2 s) instead of SessionManager's 30 s
(pitfalls item 4), so their first step follows the chief's within about a
second. Worker-local state (input iterators, local step counters) is in the
local init op, run by every session after the model is ready.

A lost ps or worker surfaces as Aborted or Unavailable. The session is then
closed and recreated the way MonitoredSession does it: the chief restores from
the last checkpoint, the others wait for it again. Unlike MonitoredSession,
every recovery is logged with its cause and their number is bounded. Steps run
from one thread only: concurrent ``run`` calls on a gRPC target can abort with
"The same RunGraph request was received twice" (pitfalls item 15).
"""

import atexit
import logging
import re
import threading
import time
from typing import Optional

from .errors import ClusterUnreachableError, TfclusterError
from .server import wait_for_cluster
from .strategies.base import rerun_false_duplicates

log = logging.getLogger("tfcluster")

#: Seconds a lost session's close may take before the recovery goes on without it.
CLOSE_TIMEOUT = 3.0
#: Seconds the final close may take: its tasks are alive, but a loaded machine is slow.
FINAL_CLOSE_TIMEOUT = 60.0

_closers = []  # closes that outlived their timeout and still run in the background


@atexit.register
def _join_closers(timeout: float = 10.0):
    # A daemon thread still inside TF's C++ Close when the interpreter exits
    # aborts the process ("terminate called ... exception not rethrown"); give
    # background closes a last chance to finish first.
    deadline = time.monotonic() + timeout
    for t in _closers:
        t.join(max(0.0, deadline - time.monotonic()))


class RecoveryLimitError(TfclusterError):
    """A session was lost more often than ``max_recoveries`` allows."""

    exit_code = 3


def _first_line(e: BaseException) -> str:
    text = getattr(e, "message", None) or str(e)
    # TF decorates some messages with a ruler line or a "Graph execution error:" header
    # first, and puts the cause of a lost task on the line after "From /job:ps/...:".
    lines = [line.strip() for line in text.splitlines()
             if line.strip("=-~ \t") and line.strip() != "Graph execution error:"]
    if not lines:
        return type(e).__name__
    m = re.fullmatch(r"(?:[A-Z_]+: )?From (/job:\S+?):", lines[0])
    if m and len(lines) > 1:
        # The task that failed the call, rather than this task's master relaying it.
        remote = re.search(r"from remote target (/job:\S+) while calling", text)
        return f"{remote.group(1) if remote else m.group(1)}: {lines[1]}"
    return lines[0]


def recoverable(e: BaseException) -> bool:
    """True for the errors a lost task causes: Aborted, Unavailable, and variables gone with a ps."""
    import tensorflow as tf
    if isinstance(e, (tf.errors.AbortedError, tf.errors.UnavailableError)):
        # (a false "received twice" lands here only after its reruns failed too)
        return True
    # A ps that came back empty: its variables are uninitialised until the chief restores them.
    return isinstance(e, tf.errors.FailedPreconditionError) and "uninitialized" in str(e).lower()


def scaffold_ops(train_graph, is_chief: bool, extra_local_init=()):
    """``(init_op, ready_op, ready_for_local_init_op, local_init_op)`` for a built TrainGraph."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    global_vars = tf1.global_variables()
    init_op = tf1.variables_initializer(global_vars, name="tfcluster_init") if is_chief else None
    ready_op = tf1.report_uninitialized_variables(global_vars + list(train_graph.state_variables))
    ready_for_local = tf1.report_uninitialized_variables(global_vars)
    local = [tf1.local_variables_initializer(), tf1.tables_initializer()] + list(extra_local_init)
    local += list(train_graph.local_init_ops)
    if is_chief:
        local += list(train_graph.chief_local_init_ops)
    for op in (ready_op, ready_for_local):
        # SessionManager runs them; an early exception must not add "never used" noise to its message.
        getattr(op, "mark_used", lambda: None)()
    return init_op, ready_op, ready_for_local, tf.group(*local, name="tfcluster_local_init")


class TrainingSession:
    """A session on this task that the loop steps through; it recreates itself after a lost task.

    ``step()`` runs one training step through the strategy's runner. ``call(fn)``
    runs ``fn(session)`` (a checkpoint save, a read) with the same recovery.
    """

    def __init__(self, train_graph, *, target: str = "", config=None, is_chief: bool = True, saver=None,
                 checkpoint_dir: Optional[str] = None, extra_local_init=(), cluster=None, name: str = "local",
                 poll_secs: float = 0.2, startup_timeout: float = 300.0, max_recoveries: int = 10,
                 summary_op=None):
        import tensorflow as tf
        tf1 = tf.compat.v1
        self.tf = tf
        self.train_graph = train_graph
        self.graph = tf1.get_default_graph()
        self.target, self.config = target, config
        self.is_chief, self.saver, self.checkpoint_dir = is_chief, saver, checkpoint_dir
        self.cluster, self.name = cluster, name
        self.poll_secs, self.startup_timeout, self.max_recoveries = poll_secs, startup_timeout, max_recoveries
        self.summary_op = summary_op
        self.init_op, self.ready_op, ready_local, self.local_init_op = scaffold_ops(
            train_graph, is_chief, extra_local_init)
        self.manager = tf1.train.SessionManager(
            local_init_op=self.local_init_op, ready_op=self.ready_op, ready_for_local_init_op=ready_local,
            graph=self.graph, recovery_wait_secs=poll_secs)
        self.session = None
        self.recoveries = 0
        self.created_at = None      # wall-clock time the model was ready for this process
        self.restored_from = None

    # ------------------------------------------------------------ creation
    def create(self):
        """Create the session (initialise/restore as chief, wait as non-chief); returns the tf session."""
        self._create(resumed=False)
        return self.session

    def _create(self, resumed: bool):
        tf = self.tf
        start = time.monotonic()
        if self.cluster is not None:
            wait_for_cluster(self.cluster, timeout=self.startup_timeout)
        try:
            if self.is_chief:
                # Without a saver there is nothing to restore with (a worker that owns a copy, not the chief).
                ckpt = (tf.train.latest_checkpoint(self.checkpoint_dir)
                        if self.checkpoint_dir and self.saver is not None else None)
                self.session = self.manager.prepare_session(
                    self.target, init_op=self.init_op, saver=self.saver if ckpt else None,
                    checkpoint_dir=self.checkpoint_dir if ckpt else None, config=self.config)
                self.restored_from = ckpt
                what = f"restored the model from {ckpt}" if ckpt else "initialised the model"
            else:
                log.info("%s waits for the chief to initialise the model (checking every %gs)", self.name,
                         self.poll_secs)
                self.session = self.manager.wait_for_session(self.target, config=self.config,
                                                             max_wait_secs=self.startup_timeout)
                ckpt = None
                what = "found the model ready"
        except tf.errors.DeadlineExceededError:
            chief = self.cluster.tasks(("chief", "worker"))[0] if self.cluster else "the chief"
            raise ClusterUnreachableError(
                f"{self.name} gave up after {self.startup_timeout:g}s waiting for the chief ({chief}) to "
                "initialise the model; is it running?") from None
        self.created_at = time.time()
        log.info("%s %s at t=%.3f (%.1fs)", self.name, what, self.created_at, time.monotonic() - start)
        self.train_graph.runner.attach(self.session, self.summary_op)
        for hook in self.train_graph.hooks:
            hook.after_create_session(self.session, bool(ckpt) or resumed)

    def _recover(self, error: BaseException):
        self.recoveries += 1
        if self.recoveries > self.max_recoveries:
            raise RecoveryLimitError(
                f"{self.name} lost its session {self.recoveries} times (max_recoveries={self.max_recoveries}); "
                f"last error: {type(error).__name__}: {_first_line(error)}") from error
        log.warning("%s lost its session (%s: %s); recreating it, recovery %d of at most %d%s",
                    self.name, type(error).__name__, _first_line(error), self.recoveries, self.max_recoveries,
                    ", restoring the last checkpoint" if self.is_chief and self.checkpoint_dir else "")
        self._close_quietly()
        while True:
            try:
                self._create(resumed=True)
                return
            except Exception as e:  # a task still down: count it, and try again while allowed
                if not recoverable(e):
                    raise
                self.recoveries += 1
                if self.recoveries > self.max_recoveries:
                    raise RecoveryLimitError(
                        f"{self.name} could not recreate its session after {self.max_recoveries} tries; "
                        f"last error: {type(e).__name__}: {_first_line(e)}") from e
                log.warning("%s: recreating the session failed (%s); retrying", self.name, _first_line(e))
                self._close_quietly()
                time.sleep(self.poll_secs)

    # ------------------------------------------------------------- running
    def step(self, with_extra: bool = False):
        """One training step (a :class:`~tfcluster.strategies.StepResult`), recovering from a lost task."""
        while True:
            try:
                return self.train_graph.runner.step(with_extra)
            except Exception as e:
                if not recoverable(e):
                    raise
                self._recover(e)

    def call(self, fn):
        """``fn(session)`` with the same recovery as a step."""
        while True:
            try:
                return rerun_false_duplicates(fn, self.session)
            except Exception as e:
                if not recoverable(e):
                    raise
                self._recover(e)

    def end(self):
        """Run the strategy hooks' ``end``."""
        for hook in self.train_graph.hooks:
            hook.end(self.session)

    def _close_quietly(self, timeout: float = CLOSE_TIMEOUT):
        if self.session is not None:
            session, self.session = self.session, None

            def close():
                try:
                    session.close()
                except Exception:  # closing a session whose tasks are gone may fail; nothing to do about it
                    pass
            # TF's Close waits, with no timeout, for every task of the session to
            # drop its graphs: with a ps gone it blocks until the ps is back, and
            # forever if it never is. The recovery's own wait is bounded and says
            # what it waits for, so the close may not block it.
            closer = threading.Thread(target=close, name="tfcluster-session-close", daemon=True)
            started = time.monotonic()
            closer.start()
            closer.join(timeout)
            if closer.is_alive():
                _closers.append(closer)
                log.debug("%s: closing the session did not finish in %gs (a task is gone?); "
                          "it finishes in the background", self.name, timeout)
            else:
                log.debug("%s: session closed in %.2fs", self.name, time.monotonic() - started)

    def close(self):
        """Close the underlying session (bounded: a task gone for good cannot hold the process)."""
        self._close_quietly(FINAL_CLOSE_TIMEOUT)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
