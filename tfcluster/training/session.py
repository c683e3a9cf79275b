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
from one thread only: concurrent ``run`` calls on a gRPC target make TF 2.21's
false duplicate aborts more frequent (pitfalls item 15, :mod:`tfcluster.core.duplicates`).
"""

import atexit
import contextlib
import logging
import threading
import time
from typing import Optional

from ..core.duplicates import rerun_in_every_session
from ..core.errors import ClusterUnreachableError, RecoveryLimitError, StepTimeoutError
from ..core.tferrors import recoverable, summary
from ..graph import crossing, precision
from ..runtime.server import READY_POLL_SECS, TaskState, wait_for_cluster
from .chief import ChiefStart

log = logging.getLogger("tfcluster")

#: Seconds a lost session's close may take before the recovery goes on without it.
CLOSE_TIMEOUT = 3.0
#: Seconds the final close may take: its tasks are alive, but a loaded machine is slow.
FINAL_CLOSE_TIMEOUT = 60.0
#: Seconds a closing session waits for its hooks' threads (TF's MonitoredSession waits 120; TF1 mode's too).
THREAD_GRACE_SECS = 5.0
#: Seconds a new session waits for the ps tasks and the chief (``startup_timeout``).
STARTUP_TIMEOUT_SECS = 300.0
#: Seconds one step may wait on a ps that stopped answering before it is named (``step_timeout_secs``).
STEP_TIMEOUT_SECS = 60.0
#: Lost sessions a run recreates before it gives up (``max_recoveries``).
MAX_RECOVERIES = 10
#: Seconds before recreating a lost session: the first wait, doubling with each recovery in a row (a step
#: that succeeds starts again from the first), and the longest. Ten in a row span 33 s, longer than gRPC
#: waits before it looks a task's name up again (30 s, its dns_min_time_between_resolutions_ms): a
#: Kubernetes pod created again keeps its name, not its address, and until then the ps that pulls its
#: gradients dials the old one; recreating at once spent every recovery in a second (tests/test_kubernetes.py).
RECOVERY_WAIT, RECOVERY_WAIT_MAX = 0.25, 5.0

_closers = []  # closes that outlived their timeout and still run in the background


@atexit.register
def _join_closers(timeout: float = 10.0):
    # A daemon thread still inside TF's C++ Close when the interpreter exits
    # aborts the process ("terminate called ... exception not rethrown"); give
    # background closes a last chance to finish first.
    deadline = time.monotonic() + timeout
    for t in _closers:
        t.join(max(0.0, deadline - time.monotonic()))


def rerun_exactly():
    """Every run TF falsely rejects in this process is run again (a step, a save, a hook's read), and reads what
    the rejected one would have: a step's input waits for its ps tasks to take the step (graph/gate.py)."""
    rerun_in_every_session()
    crossing.install()


def start_input(session, coord, graph, prime=None):
    """A new session's input: TF 1.x's queue runners (string_input_producer, shuffle_batch), then the first batch
    the step's lookups stage (``prime``, graph/prefetch.py), from the input as it runs now."""
    import tensorflow as tf
    if graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
        from tensorflow.python.util import deprecation
        with deprecation.silence():
            tf.compat.v1.train.start_queue_runners(session, coord, daemon=True)
    if prime is not None:
        session.run(prime)


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

    Lifecycle: ``finalize(hooks)`` once the graph is built (hooks' ``begin``,
    the init and readiness ops, then the graph is finalized); ``create()``;
    then ``step()`` runs one training step through the strategy's runner, and
    ``call(fn)`` runs ``fn(session)`` (a checkpoint save, a read) with the same
    recovery. Each session has a ``tf.train.Coordinator`` for hooks that start
    threads (queue runners); its threads are stopped when the session goes.
    """

    def __init__(self, train_graph, *, target: str = "", config=None, is_chief: bool = True, saver=None,
                 checkpoint_dir: Optional[str] = None, extra_local_init=(), cluster=None, name: str = "local",
                 poll_secs: float = READY_POLL_SECS, startup_timeout: float = STARTUP_TIMEOUT_SECS,
                 max_recoveries: int = MAX_RECOVERIES, init_fn=None, init_feed_dict=None,
                 step_timeout_secs: float = STEP_TIMEOUT_SECS):
        import tensorflow as tf
        self.tf = tf
        rerun_exactly()
        self.train_graph = train_graph
        self.graph = tf.compat.v1.get_default_graph()
        self.target, self.config = target, config
        self.is_chief, self.saver, self.checkpoint_dir = is_chief, saver, checkpoint_dir
        self.cluster, self.name = cluster, name
        self.poll_secs, self.startup_timeout, self.max_recoveries = poll_secs, startup_timeout, max_recoveries
        self.extra_local_init = list(extra_local_init)
        self.init_fn, self.init_feed_dict = init_fn, init_feed_dict   # a Scaffold's: after initialising, not restoring
        self.step_timeout_secs = step_timeout_secs
        self.hooks = list(train_graph.hooks)
        self.manager = None
        self.session = self.coord = None
        self._prime = None       # the staged lookups' first batch (graph/prefetch.py)
        self.recoveries = 0
        self.in_a_row = 0           # recoveries since the last step that succeeded
        self.created_at = None      # wall-clock time the model was ready for this process
        self.restored_from = None

    def finalize(self, hooks=(), freeze: bool = True, device=None):
        """Add ``hooks`` (after the strategy's), call every hook's ``begin``, build the session's ops, finalize.

        ``freeze``: finalize the graph too. tf-keras's loop adds ops as it goes
        (a dataset's iterator, the validation step), so Keras leaves it open.
        ``device``: where the hooks' own variables go, as the model's did (TF 1.x's
        Estimator began its hooks under its device function: an early-stopping
        hook's flag is then on the ps, where every worker reads it). They are
        not saved: the chief initialises them after a restore.
        """
        tf1 = self.tf.compat.v1
        self.hooks += list(hooks)
        with self.graph.as_default():
            before = {id(v) for v in tf1.global_variables()}
            with tf1.device(device) if device is not None else contextlib.nullcontext():
                for hook in self.hooks:
                    hook.begin()
            # A hook's own variables (an early-stopping flag) are not in the checkpoints the Saver, made before,
            # writes: a restore must not need them, so the chief initialises them after it.
            added = [v for v in tf1.global_variables() if id(v) not in before]
            hooks_init = tf1.variables_initializer(added) if added else None
            self.init_op, self.ready_op, ready_local, self.local_init_op = scaffold_ops(
                self.train_graph, self.is_chief, self.extra_local_init)
            self._read_step = self.train_graph.global_step.read_value()
            staging = self.train_graph.staging
            if staging is not None and self.config is not None and precision.is_on(self.config):
                staging.narrow_rows()       # before the first run packs the crossings (graph/crossing.py)
            self._prime = staging.prime() if staging is not None else None
            self.manager = tf1.train.SessionManager(
                local_init_op=self.local_init_op, ready_op=self.ready_op, ready_for_local_init_op=ready_local,
                graph=self.graph, recovery_wait_secs=self.poll_secs)
            self.chief_start = ChiefStart(
                self.graph, self.target, self.config, self.init_op, self.ready_op, ready_local, self.local_init_op,
                self.saver, self.checkpoint_dir, self.init_fn, self.init_feed_dict, self.name, hooks_init)
        if freeze:
            self.graph.finalize()  # no op may be added per step: a growing graph is a slow leak

    # ------------------------------------------------------------ creation
    def create(self):
        """Create the session (initialise/restore as chief, wait as non-chief); returns the tf session."""
        self._create()
        return self.session

    def _create(self):
        tf = self.tf
        start = time.monotonic()
        if self.cluster is not None:
            wait_for_cluster(self.cluster, timeout=self.startup_timeout)
        try:
            if self.is_chief:
                self.session = self.chief_start.create()
                self.restored_from, what = self.chief_start.restored_from, self.chief_start.what
            else:
                log.info("%s waits for the chief to initialise the model (checking every %gs)", self.name,
                         self.poll_secs)
                self.session = self.manager.wait_for_session(self.target, config=self.config,
                                                             max_wait_secs=self.startup_timeout)
                what = "found the model ready"
        except tf.errors.DeadlineExceededError:
            chief = self.cluster.chief_task if self.cluster else "the chief"
            raise ClusterUnreachableError(
                f"{self.name} gave up after {self.startup_timeout:g}s waiting for the chief ({chief}) to "
                "initialise the model; is it running?") from None
        self.created_at = time.time()
        if self.restored_from is not None and self.is_chief:
            # Async: other workers' updates land while the chief saves, so a checkpoint named by the step read
            # before the save holds a later one (TF 1.x's too). Training resumes from the one it holds.
            log.info("%s %s (global step %d, %.1fs)", self.name, what, self.session.run(self._read_step),
                     time.monotonic() - start)
        else:
            log.info("%s %s (%.1fs)", self.name, what, time.monotonic() - start)
        log.debug("%s %s at t=%.3f", self.name, what, self.created_at)   # for tools that measure start-up
        self.coord = tf.compat.v1.train.Coordinator()
        start_input(self.session, self.coord, self.graph, self._prime)
        # A step may wait on ps tasks only for so long: one that stops answering (a hung host) is found.
        bounded = self.cluster is not None and self.cluster.num_tasks("ps")
        self.train_graph.runner.attach(self.session, self.step_timeout_secs if bounded else None)
        for hook in self.hooks:
            hook.after_create_session(self.session, self.coord)

    def _recover(self, error: BaseException):
        self.recoveries += 1
        if self.recoveries > self.max_recoveries:
            raise RecoveryLimitError(
                f"{self.name} lost its session {self.recoveries} times (max_recoveries={self.max_recoveries}); "
                f"last error: {type(error).__name__}: {summary(error)}") from error
        log.warning("%s lost its session (%s: %s); recreating it, recovery %d of at most %d", self.name,
                    type(error).__name__, summary(error), self.recoveries, self.max_recoveries)
        self._close_quietly()
        time.sleep(min(RECOVERY_WAIT * 2 ** self.in_a_row, RECOVERY_WAIT_MAX))
        self.in_a_row += 1
        while True:
            try:
                self._create()
                return
            except Exception as e:  # a task still down: count it, and try again while allowed
                if not recoverable(e):
                    raise
                self.recoveries += 1
                if self.recoveries > self.max_recoveries:
                    raise RecoveryLimitError(
                        f"{self.name} could not recreate its session after {self.max_recoveries} tries; "
                        f"last error: {type(e).__name__}: {summary(e)}") from e
                log.warning("%s: recreating the session failed (%s); retrying", self.name, summary(e))
                self._close_quietly()
                time.sleep(self.poll_secs)

    # ------------------------------------------------------------- running
    def step(self, request=None):
        """One training step (a :class:`~tfcluster.strategies.StepResult`), recovering from a lost task.

        ``request``: what hooks want fetched along (:class:`~tfcluster.training.hooks.RunArgs`), or None.
        """
        while True:
            try:
                result = self.train_graph.runner.step(request)
                self.in_a_row = 0
                return result
            except self.tf.errors.DeadlineExceededError as e:
                self._recover(self._silent(e))
            except Exception as e:
                if not recoverable(e):
                    raise
                self._recover(e)

    def _silent(self, error):
        """A step outlasted step_timeout_secs: name the tasks that stopped answering, or say it is just slow."""
        if self.cluster is None:
            raise error
        from ..runtime.server import probe
        states = probe(self.cluster, self.cluster.needed_tasks(), timeout=2.0)
        silent = [f"{t} at {self.cluster.address(t)}" for t, state in states.items() if state is not TaskState.UP]
        if not silent:
            raise StepTimeoutError(
                f"{self.name}: a step took more than {self.step_timeout_secs:g}s although every task answers; "
                "if steps are that slow, raise step_timeout_secs") from None
        log.warning("%s: %s %s not answered for %gs (step_timeout_secs): stopped, or cut off; waiting for it "
                    "(at most %gs)", self.name, ", ".join(silent), "has" if len(silent) == 1 else "have",
                    self.step_timeout_secs, self.startup_timeout)
        return error

    def call(self, fn):
        """``fn(session)`` with the same recovery as a step (a run of it bounded by :attr:`step_options` that
        times out names the silent task, as a step does)."""
        while True:
            try:
                return fn(self.session)
            except self.tf.errors.DeadlineExceededError as e:
                self._recover(self._silent(e))
            except Exception as e:
                if not recoverable(e):
                    raise
                self._recover(e)

    @property
    def step_options(self):
        """RunOptions with the step timeout (None when steps are unbounded): for runs beside the steps."""
        return self.train_graph.runner.step_options

    def global_step(self) -> int:
        """The global step the session holds now."""
        return int(self.call(lambda s: s.run(self._read_step)))

    def _join_threads(self, coord):
        try:
            coord.join(stop_grace_period_secs=THREAD_GRACE_SECS, ignore_live_threads=True)
        except Exception as e:  # a thread's own error (its run cancelled by the close): nothing to report
            log.debug("%s: a session thread ended with %s", self.name, summary(e))

    def _close_quietly(self, timeout: float = CLOSE_TIMEOUT):
        # Threads (queue runners, SyncReplicasOptimizer's chief) blocked in a run end only when the session
        # closes and cancels it: stop them, close, then join them.
        coord, self.coord = self.coord, None
        if coord is not None:
            coord.request_stop()
        self._close_session(timeout)
        if coord is not None:
            self._join_threads(coord)

    def _close_session(self, timeout: float):
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
