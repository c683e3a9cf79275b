"""Running a sync step (:mod:`.sync`), with every wait bounded, named, and given up on a SIGTERM or a lost chief.

A wait is a run with a timeout of at most :data:`POLL_SECS`; when it times out,
the runner looks up (the ``on_stall`` checks: a SIGTERM, the chief's
heartbeat), says after ``stall_warn_secs`` which workers have not pushed, and
raises :class:`~tfcluster.core.errors.SyncStallError` naming them after
``stall_timeout_secs``; otherwise it resumes the wait. Two drivers share this:

- :class:`SyncRunner`, ``fit``'s step: push, wait and (on the chief) apply in
  one run, the usual case;
- :class:`SyncFinish`, TF 1.x's ``SyncReplicasOptimizer``: the script's train
  op pushes, then this waits for the update (the chief: for the other
  gradients, then applies).
"""

import logging
import threading
import time

from ..core import environment
from ..core.checks import seconds, seconds_from
from ..core.duplicates import ATTEMPTS, is_false_duplicate, note_met, rerun, reruns_its_own, warn_rerun
from ..core.errors import SyncStallError
from ..graph.step import StepResult, StepRunner, run_with_request

log = logging.getLogger("tfcluster")

#: Longest a sync wait runs before it looks up (stall reports, a lost chief, a SIGTERM).
POLL_SECS = 5.0
#: A sync step names the workers it waits for after this long, and gives up after the timeout.
STALL_WARN_SECS, STALL_TIMEOUT_SECS = 30.0, 600.0


def stall_defaults(warn_secs=None, timeout_secs=None) -> tuple:
    """``(stall_warn_secs, stall_timeout_secs)``: those given, else ``TFCLUSTER_SYNC_STALL_SECS`` and
    ``TFCLUSTER_SYNC_TIMEOUT_SECS``, else 30 s and 600 s."""
    def pick(given, variable, default, name):
        return seconds(name, given) if given is not None else seconds_from(variable, default)
    return (pick(warn_secs, environment.SYNC_STALL_SECS, STALL_WARN_SECS, "stall_warn_secs"),
            pick(timeout_secs, environment.SYNC_TIMEOUT_SECS, STALL_TIMEOUT_SECS, "stall_timeout_secs"))


def _warn_rejected(step: int, applied: bool, attempt: int):
    """Say that TF falsely rejected (part of) sync step ``step`` and what happens next."""
    if applied:
        note_met()
        log.warning("TF falsely rejected part of sync step %d as a duplicate request (pitfalls item 15) "
                    "after the global step moved on; with several ps, some of them may have missed that "
                    "one update", step)
    else:
        warn_rerun(attempt + 1, what=f"sync step {step}")


def _report(graph):
    """Where a step stands: this worker's local step, the global step, every worker's stamp."""
    tf, tf1 = graph.tf, graph.tf1
    with tf1.device(graph.coord):
        stamps = tf.stack([s.read_value() for s in graph.stamps])
        gs = graph.read_global_step()
    with tf1.device(graph.worker):
        return [graph.local_step.read_value(), gs, stamps]


def _settle(graph):
    """The chief's local step set to the global step (after a step it applied in pieces)."""
    with graph.tf1.device(graph.worker):
        return graph.local_step.assign(graph.read_global_step(), read_value=True)


class SyncWaits:
    """The bounded waits of one worker's sync step on one session, and the stall lines they write.

    ``first``: the op of the step's usual run (it returns the new global
    step); ``retry``: the wait alone, resumed after a timeout; ``apply`` (the
    chief): the update alone, after a wait that was resumed.
    """

    def __init__(self, graph, first, retry, apply=None, stall_warn_secs: float = STALL_WARN_SECS,
                 stall_timeout_secs=STALL_TIMEOUT_SECS, on_stall=None, loss=None):
        import tensorflow as tf
        self.tf, self.graph = tf, graph
        self.chief = graph.is_chief
        self.first, self.retry, self.apply = first, retry, apply
        # The loss fetched with the first run: the step's own when it pushes in that run, else the last pushed.
        self.first_loss = loss if loss is not None else graph.last_loss_value
        self.settle = _settle(graph) if self.chief else None
        self.report = _report(graph)
        self.warn_secs, self.timeout_secs = stall_warn_secs, stall_timeout_secs
        # A wait looks up every few seconds, whatever the warning period: a SIGTERM (preemption.py) or a
        # lost chief (liveness.py) ends it within a scheduler's grace period.
        self.options = tf.compat.v1.RunOptions(timeout_in_ms=int(min(stall_warn_secs, POLL_SECS) * 1000))
        #: Called while a wait lasts: a check may raise to end it (the loop's SIGTERM, the chief's heartbeat).
        self.on_stall = on_stall if on_stall is not None else []
        self.steps_done = 0

    def attach(self, session, step_options=None):
        """Build this session's callables: waits time out into stall lines, the rest at ``step_options``."""
        make_callable = session.make_callable

        def bounded(fetches):      # a ps that stops answering fails the call, not hangs it
            call = make_callable(fetches, accept_options=True)
            return lambda: call(options=step_options)
        self.session = session
        self._first = make_callable([self.first, self.first_loss], accept_options=True)
        self._retry = make_callable([self.retry, self.graph.last_loss_value], accept_options=True)
        self._apply = bounded(self.apply) if self.chief else None
        self._settle = bounded(self.settle) if self.chief else None
        self._report = bounded(self.report)
        self._loss_now = bounded(self.graph.last_loss_value)

    def run(self, first=None):
        """Run the step (``first(options)``, by default the first op), resuming a wait that timed out.

        Returns ``(new global step, loss, results, run metadata)``.
        """
        started = time.monotonic()
        first = first or (lambda options: (*self._first(options=options), None, None))
        try:
            if self.chief:
                with reruns_its_own():
                    out = self._first_on_chief(first)
            else:
                # Pushes and waits are idempotent: a falsely rejected one is simply rerun (the session layer).
                out = first(self.options)
        except self.tf.errors.DeadlineExceededError:
            got, loss = self._wait(started)
            if self.chief:
                with reruns_its_own():
                    got = self._apply_step(int(got))
            out = (got, loss, None, None)
        self.steps_done += 1
        return out

    def _first_on_chief(self, first):
        """The chief's wait+apply, rerun when TF falsely rejects it, unless the step was applied."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return first(self.options)
            except self.tf.errors.OpError as e:
                if attempt == ATTEMPTS or not is_false_duplicate(e):
                    raise
            step, gs, _ = rerun(self._report)
            _warn_rejected(step, gs > step, attempt)
            if gs > step:
                return int(rerun(self._settle)), float(rerun(self._loss_now)), None, None

    def _apply_step(self, step):
        """Apply sync step ``step`` once (after a stalled wait), even when TF falsely rejects part of it."""
        for attempt in range(1, ATTEMPTS + 1):
            # The coordinator ps either applied the step (global step moved on)
            # or did not; only another ps's part can have been lost.
            gs = int(rerun(self._settle))
            if attempt > 1:
                _warn_rejected(step, gs > step, attempt - 1)
            if gs > step:
                return gs
            try:
                return self._apply()
            except self.tf.errors.OpError as e:
                if attempt == ATTEMPTS or not is_false_duplicate(e):
                    raise

    def _wait(self, started):
        next_report = self.warn_secs
        while True:
            waited = time.monotonic() - started
            for check in list(self.on_stall):    # the chief's heartbeat, a SIGTERM: they may end the wait
                check()
            if waited >= next_report or (self.timeout_secs is not None and waited >= self.timeout_secs):
                self._log_stall(waited)
                next_report = waited + self.warn_secs
            try:
                return self._retry(options=self.options)
            except self.tf.errors.DeadlineExceededError:
                pass

    def _log_stall(self, waited):
        step, gs, stamps = self._report()
        trainers = self.graph.trainers
        have = [trainers[i] for i, s in enumerate(stamps) if s == step]
        missing = [f"{trainers[i]} (last step {s})" if s >= 0 else f"{trainers[i]} (none yet)"
                   for i, s in enumerate(stamps) if s != step]
        what = (f"{trainers[self.graph.index]} has waited {waited:.0f}s on sync step {step}: "
                f"{len(have)} of {self.graph.to_aggregate} gradient(s) in ({', '.join(have) or 'none'})")
        if len(have) >= self.graph.to_aggregate and not self.chief:
            what += f"; waiting for the chief ({trainers[0]}) to apply it (global step {gs})"
        elif missing:
            what += f"; not yet from {', '.join(missing)}"
        if self.timeout_secs is not None and waited >= self.timeout_secs:
            raise SyncStallError(f"sync step stalled for {waited:.0f}s (stall_timeout_secs="
                                 f"{self.timeout_secs:g}): {what.split(': ', 1)[1]}") from None
        (log.info if self.steps_done == 0 else log.warning)(what)


class SyncRunner(StepRunner):
    """``fit``'s sync step: chief = push+wait+apply, worker = push+wait, in one run; waits bounded."""

    def __init__(self, graph, stall_warn_secs: float = STALL_WARN_SECS, stall_timeout_secs=STALL_TIMEOUT_SECS):
        tf1 = graph.tf1
        stamped, step = graph.push()
        if graph.is_chief:
            count = graph.wait_for_gradients(step, deps=[stamped])
            # The usual step is one run: push, wait, apply. Its second run cost
            # sync 8% of its throughput (scripts/bench.py, P3).
            first, apply = graph.apply(deps=[count]), graph.apply()
            with tf1.device(graph.worker):
                # The retry waits, then apply runs on its own.
                waiting_for = graph.local_step.read_value()
                with graph.tf.control_dependencies([graph.wait_for_gradients(waiting_for)]):
                    retry = graph.tf.identity(waiting_for)
        else:
            first, apply = graph.wait_for_update(step, deps=[graph.arrive([stamped])]), None
            retry = graph.wait_for_update()
        super().__init__(first, graph.loss)
        self.waits = SyncWaits(graph, first, retry, apply, stall_warn_secs, stall_timeout_secs, self.on_stall,
                               loss=graph.loss)

    def attach(self, session, step_timeout_secs=None):
        """Build the callables for this session: waits time out into stall reports, the rest at the step timeout."""
        super().attach(session, step_timeout_secs)
        self.waits.attach(session, self.step_options)

    def _first_run(self, request):
        """The step's first run as ``options -> (global step, loss, results, metadata)``."""
        if request is None:
            return None
        if request.options is not None:
            # A hook's options (a trace) keep the wait's timeout, which stall reports rely on.
            merged = self.waits.tf.compat.v1.RunOptions()
            merged.CopyFrom(request.options)
            merged.timeout_in_ms = self.waits.options.timeout_in_ms
            request = request._replace(options=merged)

        def run(options):
            (gs, loss), results, meta = run_with_request(self._session.run, [self.train_fetch, self.loss], request,
                                                         options)
            return gs, loss, results, meta
        return run

    def step(self, request=None) -> StepResult:
        """Run one sync step; a wait that outlasts stall_warn_secs is reported and resumed."""
        got, loss, results, meta = self.waits.run(self._first_run(request))
        return StepResult(int(got), float(loss), results, meta)


class SyncFinish:
    """The wait after a run in which this worker pushed (TF 1.x's SyncReplicasOptimizer); the chief applies.

    ``pushed(session)`` tells whether a run pushed: this worker's push count
    moved since the last look.
    """

    def __init__(self, graph, stall_warn_secs: float = STALL_WARN_SECS, stall_timeout_secs=STALL_TIMEOUT_SECS):
        if graph.is_chief:
            retry = graph.wait_for_gradients()
            first, apply = graph.apply(deps=[retry]), graph.apply()
        else:
            first = retry = graph.wait_for_update()
            apply = None
        self.graph = graph
        self.waits = SyncWaits(graph, first, retry, apply, stall_warn_secs, stall_timeout_secs)
        self.session = None
        self.seen = 0
        #: True when a tfcluster loop runs the wait after each step (:class:`FinishingRunner`); else every
        #: run that pushed is followed by it (:func:`~.sync_replicas.finish_after_pushing_runs`).
        self.driven = False
        #: Held while a thread looks whether this worker pushed and finishes that push: one look at a time.
        self.looking = threading.Lock()

    def pushed(self, session) -> bool:
        """True when this worker pushed since the last look; a session's first look counts from its local init."""
        try:
            now = int(session.run(self.graph.pushes_value))
        except self.waits.tf.errors.OpError:    # its local state is not initialised: nothing pushed on it yet
            return False
        if session is not self.session:
            self.session, self.seen = session, 0
            self.waits.attach(session)
        pushed, self.seen = now > self.seen, now
        return pushed

    def finish(self):
        """Wait (bounded) until the step this worker pushed is applied; the chief applies it. The new step."""
        got, _, _, _ = self.waits.run()
        return int(got)


class FinishingRunner:
    """A runner whose train op only pushes (SyncReplicasOptimizer's): after each step, the wait for its update.

    It wraps the :class:`~tfcluster.graph.step.StepRunner` of the Estimator's
    ``model_fn`` or of a Keras model, so the global step the loop sees is the
    one after the update, and the loop's SIGTERM check and the chief's
    heartbeat end a wait (``on_stall``).
    """

    def __init__(self, runner, finishes):
        self.runner = runner
        self.train_fetch, self.loss, self.on_stall = runner.train_fetch, runner.loss, runner.on_stall
        self.session = None
        self.finishes = list(finishes)
        for finish in self.finishes:
            finish.driven = True
            finish.waits.on_stall = self.on_stall

    @property
    def step_options(self):
        """The wrapped runner's RunOptions (the step timeout)."""
        return self.runner.step_options

    def attach(self, session, step_timeout_secs=None):
        """Bind the wrapped runner to ``session``."""
        self.session = session
        self.runner.attach(session, step_timeout_secs)

    def step(self, request=None) -> StepResult:
        """Run the step (the push); when this worker pushed, wait for the update it pushed for."""
        result = self.runner.step(request)
        for finish in self.finishes:
            if finish.pushed(self.session):
                result.global_step = finish.finish()
        return result
