"""Synchronous parameter-server steps: every gradient counted once per distinct worker, every wait bounded.

One update per global step, from the gradients of at least
``replicas_to_aggregate`` (R) *distinct* workers. TensorFlow's
SyncReplicasOptimizer counts gradients, so one fast worker can fill a step with
its own repeated gradients while the others are still starting (docs/pitfalls.md,
item 5); here each worker has its own gradient slot on the ps, next to the
variable, stamped with the step it belongs to. A repeated push overwrites that
worker's slot; it can never count twice. The chief waits until R slots carry
the current step, adds them (scaled by R/k when k > R arrived, so backups never
change the update's size), applies once, and wakes the workers through one
queue each. Workers beyond R are backups: a step does not wait for the slowest.

Every wait is bounded: a wait that lasts ``stall_warn_secs`` logs which
workers have not contributed, and after ``stall_timeout_secs`` it raises
:class:`~tfcluster.core.errors.SyncStallError` naming them (a worker died and no
backup covers it). Pushes are idempotent and waits re-check state on the ps,
so a wait that timed out is simply resumed. The slots cost one extra copy of
the model per worker on the ps, the price of exactness; they are not
checkpointed.
"""

import logging
import time

from ..core.duplicates import ATTEMPTS, is_false_duplicate, rerun, warn_rerun
from ..core.errors import SyncStallError
from ..graph.placement import SYNC_STATE_COLLECTION
from ..graph.step import StepResult, StepRunner, TrainGraph, run_with_request

log = logging.getLogger("tfcluster")

#: Longest a sync wait runs before it looks up (stall reports, a lost chief, a SIGTERM).
POLL_SECS = 5.0


class SyncBuilder:
    """Builds the per-worker slots, stamps and queues of a sync step, and its runner."""

    def __init__(self, strategy, gs, opt, mean, grads, update_ops):
        import tensorflow as tf
        self.tf, self.tf1 = tf, tf.compat.v1
        self.s = strategy
        self.gs, self.opt, self.mean, self.grads, self.update_ops = gs, opt, mean, grads, update_ops
        self.trainers = strategy.cluster.trainers()
        self.n = len(self.trainers)
        self.me = strategy.worker_index
        self.r = strategy.replicas_to_aggregate
        self.is_chief = strategy.is_chief
        # All coordination state lives with the global step, so every wait
        # loop runs on one device and never crosses the network per iteration.
        self.coord = gs.device
        self.worker = strategy.task.device
        self.state = []          # (variable, initial-value function)

    def _state_var(self, name, initial, device=None, colocate=None):
        tf1 = self.tf1
        # The graph's own colocate_with is tf1.colocate_with without its deprecation warning, printed by
        # every worker (same placement: it is what tf1.colocate_with calls in graph mode).
        ctx = tf1.get_default_graph().colocate_with(colocate) if colocate is not None else tf1.device(device)
        with ctx:
            v = tf1.Variable(initial(), trainable=False, use_resource=True, name=name,
                             collections=[SYNC_STATE_COLLECTION])
        self.state.append((v, initial))
        return v

    def _read_gs(self):
        return self.tf.cast(self.gs.read_value(), self.tf.int64)

    def build(self, out) -> TrainGraph:
        """Create the sync state and the ops of this worker's role."""
        tf, tf1 = self.tf, self.tf1
        with tf1.name_scope("tfcluster_sync"):
            with tf1.device(self.coord):
                self.stamps = [self._state_var(f"stamp_{i}", lambda: tf.constant(-1, tf.int64),
                                               device=self.coord) for i in range(self.n)]
                self.arrivals = tf1.FIFOQueue(max(64, 8 * self.n), [tf.int32], shapes=[[]],
                                              shared_name="tfcluster_sync_arrivals", name="arrivals")
                self.wakeups = [tf1.FIFOQueue(2, [tf.int64], shapes=[[]], shared_name=f"tfcluster_sync_wakeup_{i}",
                                              name=f"wakeup_{i}") for i in range(self.n)]
            self.slots = []
            for g, v in self.grads:
                shape, dtype = v.shape, v.dtype.base_dtype
                self.slots.append([self._state_var(f"{v.op.name}/grad_{i}",
                                                   lambda shape=shape, dtype=dtype: tf.zeros(shape, dtype),
                                                   colocate=v) for i in range(self.n)])
            with tf1.device(self.worker):
                self.local_step = tf1.Variable(self._read_gs(), trainable=False, use_resource=True,
                                               name="local_step",
                                               collections=[tf1.GraphKeys.LOCAL_VARIABLES])
                # The loss of a step whose wait timed out is still reported, from here.
                self.last_loss = tf1.Variable(float("nan"), trainable=False, use_resource=True,
                                              name="last_loss", collections=[tf1.GraphKeys.LOCAL_VARIABLES])
            if self.is_chief:
                runner = self._build_chief()
            else:
                runner = self._build_worker()
            report = self._report()
            runner.set_report(report)
            chief_init = []
            if self.is_chief:
                slots = [(v, init) for v, init in self.state if not any(v is st for st in self.stamps)]
                chief_init = [self._init_if_needed(v, init) for v, init in slots] + [self._reset_and_wake()]
        return TrainGraph(runner, self.gs, self.mean, chief_local_init_ops=chief_init,
                          state_variables=[v for v, _ in self.state], model=out)

    # ---------------------------------------------------------------- pieces
    def _push(self, deps=()):
        """Write this worker's gradients into its slots, then stamp them with its step."""
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.worker), tf.control_dependencies(list(deps)):
            step = self.local_step.read_value()
            writes = [self.last_loss.assign(self.mean, read_value=False)]
        for (g, v), slots in zip(self.grads, self.slots):
            if isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            with tf1.get_default_graph().colocate_with(v):
                writes.append(slots[self.me].assign(g, read_value=False))
        with tf1.device(self.coord), tf.control_dependencies(writes):
            stamped = self.stamps[self.me].assign(step, read_value=False)
        return stamped, step

    def _count(self, step):
        tf = self.tf
        return tf.add_n([tf.cast(tf.equal(s.read_value(), step), tf.int32) for s in self.stamps])

    def _on_the_ps(self, step):
        """``step`` (read on this worker) copied once to the ps, for a wait loop to compare with.

        TF 2.21's while_loop passes each tensor its condition captures through
        every iteration: the worker's step, captured as it was, made each
        iteration of a wait a round trip to the worker, 3-5 ms of a 15 ms sync
        step of the bench MLP (a traced step, scripts/bench/profile_step.py).
        Copied to the ps first, the loop runs on the ps alone.
        """
        with self.tf1.device(self.coord):
            return self.tf.identity(step)

    def _wait_for_gradients(self, step, deps=()):
        """On the chief: block until R distinct workers' slots carry ``step``."""
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.coord), tf.control_dependencies(list(deps)):
            step = self._on_the_ps(step)

            def body(i):
                with tf.control_dependencies([self.arrivals.dequeue()]):
                    return i + 1
            loops = tf1.while_loop(lambda i: self._count(step) < self.r, body, [tf.constant(0)],
                                   back_prop=False, parallel_iterations=1)
            with tf.control_dependencies([loops]):
                return self._count(step)

    def _wait_for_update(self, step, deps=()):
        """On a worker: block until the chief applied ``step`` (or reset this worker's stamp)."""
        tf, tf1 = self.tf, self.tf1
        mine = self.stamps[self.me]
        with tf1.device(self.coord), tf.control_dependencies(list(deps)):
            step = self._on_the_ps(step)

            def cond(i):
                return tf.logical_and(tf.equal(self._read_gs(), step), tf.equal(mine.read_value(), step))

            def body(i):
                with tf.control_dependencies([self.wakeups[self.me].dequeue()]):
                    return i + 1
            loops = tf1.while_loop(cond, body, [tf.constant(0)], back_prop=False, parallel_iterations=1)
            with tf.control_dependencies([loops]):
                new = self._read_gs()
        with tf1.device(self.worker):
            with tf.control_dependencies([self.local_step.assign(new, read_value=False)]):
                return tf.identity(new)

    def _wake(self, i, value):
        """Put one wake-up in worker i's queue unless one is already there (the chief is its only producer)."""
        tf, tf1 = self.tf, self.tf1
        q = self.wakeups[i]

        def put():
            with tf.control_dependencies([q.enqueue(value)]):
                return tf.constant(True)
        return tf1.cond(tf.equal(q.size(), 0), put, lambda: tf.constant(False))

    def _apply(self, deps=()):
        """On the chief: add the slots stamped with the current step, apply once, wake everyone."""
        with self.tf.control_dependencies(list(deps)):
            return self._apply_after()

    def _apply_after(self):
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.worker):
            step = self.local_step.read_value()
        with tf1.device(self.coord):
            hits = [tf.equal(s.read_value(), step) for s in self.stamps]
            k = tf.add_n([tf.cast(h, tf.int32) for h in hits])
            # Never apply a step that fewer than R distinct workers filled.
            check = tf1.debugging.assert_greater_equal(k, self.r, message="sync step under-filled")
        aggregated = []
        with tf.control_dependencies([check]):
            for (g, v), slots in zip(self.grads, self.slots):
                dtype = v.dtype.base_dtype
                with tf1.get_default_graph().colocate_with(v):
                    if self.r == self.n:
                        # No backups: the check above holds only when every slot carries this step, so
                        # the masks and the scale are all 1; two passes over each gradient saved.
                        aggregated.append((tf.add_n([slot.read_value() for slot in slots]), v))
                        continue
                    total = tf.add_n([tf.cast(h, dtype) * slot.read_value() for h, slot in zip(hits, slots)])
                    scale = tf.cast(self.r, dtype) / tf.cast(k, dtype)
                    aggregated.append((total * scale, v))
            apply = self.opt.apply_gradients(aggregated, global_step=self.gs)
        with tf1.device(self.coord):
            with tf.control_dependencies([apply]):
                drained = self.arrivals.dequeue_many(self.arrivals.size())
            with tf.control_dependencies([drained]):
                new = self._read_gs()
                wakes = [self._wake(i, new) for i in range(self.n) if i != self.me]
        with tf1.device(self.worker), tf.control_dependencies(wakes):
            with tf.control_dependencies([self.local_step.assign(new, read_value=False)]):
                return tf.identity(new)

    def _reset_and_wake(self):
        """Part of the chief's local init, on every session it creates: forget stamped pushes, wake every worker.

        A chief that initialised or restored the model may hold weights other
        than those pending pushes were computed with (a restart rolls the
        global step back). A worker whose stamp is cleared leaves its wait and
        pushes again for the step the chief now holds. Non-chief workers only
        become ready after this ran, so a fresh run loses no push.
        """
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.coord):
            resets = [s.assign(-1, read_value=False) for s in self.stamps]
            with tf.control_dependencies(resets):
                new = self._read_gs()
                wakes = [self._wake(i, new) for i in range(self.n) if i != self.me]
            with tf.control_dependencies(resets + wakes):  # a lone worker has nobody to wake
                return tf.no_op(name="reset_and_wake")

    def _init_if_needed(self, v, initial):
        """Initialise ``v`` unless it already is: the chief runs this after every restore."""
        tf, tf1 = self.tf, self.tf1
        with tf1.get_default_graph().colocate_with(v):
            def init():
                with tf.control_dependencies([v.assign(initial(), read_value=False)]):
                    return tf.constant(True)
            return tf1.cond(v.is_initialized(), lambda: tf.constant(False), init).op

    def _report(self):
        tf, tf1 = self.tf, self.tf1
        with tf1.device(self.coord):
            stamps = tf.stack([s.read_value() for s in self.stamps])
            gs = self._read_gs()
        with tf1.device(self.worker):
            return [self.local_step.read_value(), gs, stamps]

    # ------------------------------------------------------------------ roles
    def _build_chief(self):
        tf, tf1 = self.tf, self.tf1
        stamped, step = self._push(deps=self.update_ops)
        count = self._wait_for_gradients(step, deps=[stamped])
        # The usual step is one run: push, wait, apply. Its second run cost
        # sync 8% of its throughput (scripts/bench.py, P3).
        first = self._apply(deps=[count])
        with tf1.device(self.worker):
            # The retry waits, then apply runs on its own.
            waiting_for = self.local_step.read_value()
            with tf.control_dependencies([self._wait_for_gradients(waiting_for)]):
                retry = tf.identity(waiting_for)
            settle = self.local_step.assign(self._read_gs(), read_value=True)
        return SyncRunner(self, chief=True, first=first, retry=retry, apply=self._apply(), settle=settle)

    def _build_worker(self):
        tf, tf1 = self.tf, self.tf1
        stamped, step = self._push(deps=self.update_ops)
        with tf1.device(self.coord), tf.control_dependencies([stamped]):
            arrived = self.arrivals.enqueue(self.me)
        first = self._wait_for_update(step, deps=[arrived])
        with tf1.device(self.worker):
            retry = self._wait_for_update(self.local_step.read_value())
        return SyncRunner(self, chief=False, first=first, retry=retry)


def _warn_rejected(step: int, applied: bool, attempt: int):
    """Say that TF falsely rejected (part of) sync step ``step`` and what happens next."""
    if applied:
        log.warning("TF falsely rejected part of sync step %d as a duplicate request (pitfalls item 15) "
                    "after the global step moved on; with several ps, some of them may have missed that "
                    "one update", step)
    else:
        warn_rerun(attempt + 1, what=f"sync step {step}")


class SyncRunner(StepRunner):
    """One sync step: chief = push+wait+apply; worker = push+wait. Waits time out into stall reports."""

    def __init__(self, b: SyncBuilder, chief: bool, first, retry, apply=None, settle=None):
        super().__init__(first, b.mean)
        self.settle = settle
        import tensorflow as tf
        self.tf = tf
        self.chief = chief
        self.first, self.retry, self.apply = first, retry, apply
        self.trainers, self.me, self.r = b.trainers, b.me, b.r
        with tf.compat.v1.device(b.worker):
            self.last_loss_value = b.last_loss.read_value()
        self.warn_secs = b.s.stall_warn_secs
        self.timeout_secs = b.s.stall_timeout_secs
        # A wait looks up every few seconds, whatever the warning period: a SIGTERM (preemption.py) or a
        # lost chief (liveness.py) ends it within a scheduler's grace period.
        self.options = tf.compat.v1.RunOptions(timeout_in_ms=int(min(self.warn_secs, POLL_SECS) * 1000))
        self.report = None
        self.steps_done = 0

    def set_report(self, report):
        """The ops that say where the step stands (local step, global step, every worker's stamp)."""
        self.report = report

    def attach(self, session, step_timeout_secs=None):
        """Build the callables for this session: waits time out into stall reports, the rest at the step timeout."""
        super().attach(session, step_timeout_secs)
        mk = session.make_callable

        def bounded(fetches):      # a ps that stops answering fails the call, not hangs it
            call = mk(fetches, accept_options=True)
            return lambda: call(options=self.step_options)
        self._first = mk([self.first, self.loss], accept_options=True)
        self._retry = mk([self.retry, self.last_loss_value], accept_options=True)
        self._apply = bounded(self.apply) if self.chief else None
        self._settle = bounded(self.settle) if self.chief else None
        self._report = bounded(self.report)
        self._loss_now = bounded(self.last_loss_value)

    def _first_run(self, request):
        """The step's first run as ``options -> (global step, loss, results, metadata)``."""
        if request is None:
            return lambda options: (*self._first(options=options), None, None)
        if request.options is not None:
            # A hook's options (a trace) keep the wait's timeout, which stall reports rely on.
            merged = self.tf.compat.v1.RunOptions()
            merged.CopyFrom(request.options)
            merged.timeout_in_ms = self.options.timeout_in_ms
            request = request._replace(options=merged)

        def run(options):
            (gs, loss), results, meta = run_with_request(self._session.run, [self.first, self.loss], request,
                                                         options)
            return gs, loss, results, meta
        return run

    def step(self, request=None) -> StepResult:
        """Run one sync step; a wait that outlasts stall_warn_secs is reported and resumed."""
        started = time.monotonic()
        first = self._first_run(request)
        try:
            if self.chief:
                out = self._first_on_chief(first)
            else:
                # Pushes and waits are idempotent, so a falsely rejected one is simply rerun.
                out = rerun(first, self.options)
        except self.tf.errors.DeadlineExceededError:
            got, loss = self._wait(started)
            if self.chief:
                got = self._apply_step(int(got))
            out = (got, loss, None, None)
        got, loss, results, meta = out
        self.steps_done += 1
        return StepResult(int(got), float(loss), results, meta)

    def _first_on_chief(self, first):
        """The chief's push+wait+apply, rerun when TF falsely rejects it, unless the step was applied."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return first(self.options)
            except self.tf.errors.AbortedError as e:
                if attempt == ATTEMPTS or not is_false_duplicate(e):
                    raise
            step, gs, _ = self._report()
            _warn_rejected(step, gs > step, attempt)
            if gs > step:
                return int(rerun(self._settle)), float(self._loss_now()), None, None

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
            except self.tf.errors.AbortedError as e:
                if attempt == ATTEMPTS or not is_false_duplicate(e):
                    raise

    def _wait(self, started):
        next_report = self.warn_secs
        while True:
            waited = time.monotonic() - started
            for check in self.on_stall:    # the chief's heartbeat, a SIGTERM: they may end the wait
                check()
            if waited >= next_report or (self.timeout_secs is not None and waited >= self.timeout_secs):
                self._log_stall(waited)
                next_report = waited + self.warn_secs
            try:
                return rerun(self._retry, options=self.options)
            except self.tf.errors.DeadlineExceededError:
                pass

    def _log_stall(self, waited):
        step, gs, stamps = self._report()
        have = [str(self.trainers[i]) for i, s in enumerate(stamps) if s == step]
        missing = [f"{self.trainers[i]} (last step {s})" if s >= 0 else f"{self.trainers[i]} (none yet)"
                   for i, s in enumerate(stamps) if s != step]
        what = (f"{self.trainers[self.me]} has waited {waited:.0f}s on sync step {step}: "
                f"{len(have)} of {self.r} gradient(s) in ({', '.join(have) or 'none'})")
        if len(have) >= self.r and not self.chief:
            what += f"; waiting for the chief ({self.trainers[0]}) to apply it (global step {gs})"
        elif missing:
            what += f"; not yet from {', '.join(missing)}"
        if self.timeout_secs is not None and waited >= self.timeout_secs:
            raise SyncStallError(f"sync step stalled for {waited:.0f}s (stall_timeout_secs="
                                 f"{self.timeout_secs:g}): {what.split(': ', 1)[1]}") from None
        (log.info if self.steps_done == 0 else log.warning)(what)
