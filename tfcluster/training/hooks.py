"""The loop's own features, built as hooks: checkpoints, summaries, progress lines, the step timeline.

Each is a :class:`~tfcluster.graph.step.Hook` (the interface, in
:mod:`tfcluster.graph.step`), so ``fit``, the Estimator and Keras add the same
ones to their loop, beside the user's and the strategy's.
"""

import collections
import itertools
import logging
import math
import os
import time
from typing import Optional

from ..core.errors import CheckpointSaveError
from ..core.tferrors import summary
from ..graph.step import Hook, RunArgs
from ..runtime.checkpoints import CHECKPOINT_NAME, remove_partial, step_in_name, write_done_marker
from .timer import Every

log = logging.getLogger("tfcluster")

#: Seconds a trainer waits at most, at the end of its training, for the other trainers' (after a SIGTERM: 5).
FINISH_TIMEOUT_SECS = 600.0
#: This process's trainings whose ends are counted, numbered per kind.
_ends_counted = collections.defaultdict(itertools.count)
#: How often the chief counts the embedding-variable rows on each ps, for the launcher's out-of-memory line.
ROWS_EVERY_SECS = 1.0
#: ``fit``'s and the Estimator's chief saves without the trainers still out once the global step stood still this
#: long: they died (the others stop within a step of the chief).
STILL_SECS = 5.0


def _op_error():
    """TensorFlow's OpError (a full disk is ResourceExhaustedError, a lost file NotFoundError...)."""
    import tensorflow as tf
    return tf.errors.OpError


def scalar_summary(tag_values: dict):
    """A ``tf.compat.v1.Summary`` of scalars, for a summary writer."""
    import tensorflow as tf
    return tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=t, simple_value=float(v))
                                       for t, v in tag_values.items()])


# ------------------------------------------------------------ built-in hooks
class CheckpointHook(Hook):
    """The chief's checkpoints: every ``save_steps`` steps or ``save_secs`` seconds, and a final one.

    After the final checkpoint it writes the done marker the evaluator waits
    for. Saves go through ``call`` (the training session's recovering call).
    """

    def __init__(self, call, saver, checkpoint_dir: str, global_step, *, save_steps: Optional[int] = None,
                 save_secs: Optional[float] = 60.0, name: str = "chief", restored_from: Optional[str] = None):
        self._call, self.saver, self.checkpoint_dir = call, saver, checkpoint_dir
        self.global_step_tensor = global_step
        self.save_steps, self.save_secs, self.name = save_steps, save_secs, name
        self.checkpoint = restored_from
        self._read = None
        # A period counts from the last attempt (a failed save tries again a period later, not every step);
        # the final save is skipped only when the last attempt at this step succeeded.
        self._every = Every(steps=save_steps, secs=save_secs or None)
        self._step = self._saved_step = None
        self._finished = True       # False after interrupted(): no done marker, the run comes back
        #: Whether the last save failed (increments wait for a full save: the failed one took their marks).
        self.failed = False

    def begin(self):
        """Make the global-step read the first session uses."""
        self._read = self.global_step_tensor.read_value()

    def after_create_session(self, session, coord):
        """Start counting from the step the session holds (restored or initialised)."""
        if self._step is None:
            self._step = self._saved_step = int(session.run(self._read))
            self._every.mark(self._step)

    def save(self, step: int, final: bool = False) -> Optional[str]:
        """Write ``model.ckpt-<step>`` now; returns its path.

        A save that fails (a full disk) leaves no partial checkpoint and the
        last good one as the latest; training goes on, and only a failed final
        save ends the run, in one line (nothing to save it again later).
        """
        prefix = os.path.join(self.checkpoint_dir, CHECKPOINT_NAME)
        log.debug("%s saving checkpoint %s-%d", self.name, CHECKPOINT_NAME, step)
        self._every.mark(step)
        try:
            path = self._call(lambda s: self.saver.save(s, prefix, global_step=step, write_meta_graph=False))
        except (OSError, _op_error()) as e:
            removed = remove_partial(self.checkpoint_dir, f"{prefix}-{step}")
            last = os.path.basename(self.checkpoint) if self.checkpoint else "none"
            log.warning("%s could not save checkpoint %s-%d (%s: %s)%s; the latest checkpoint is still %s%s",
                        self.name, CHECKPOINT_NAME, step, type(e).__name__, summary(e),
                        f"; removed its partial files {', '.join(removed)}" if removed else "", last,
                        "" if final else "; training goes on")
            self.failed = True
            if final:
                raise CheckpointSaveError(f"{self.name} could not save its final checkpoint {CHECKPOINT_NAME}-{step}: "
                                          f"{summary(e)}; the latest checkpoint is {last}") from None
            return None
        log.info("%s saved checkpoint %s", self.name, os.path.basename(path))
        self.checkpoint, self._saved_step, self.failed = path, step, False
        return path

    def interrupted(self, global_step: int):
        """The loop stops before its end (a SIGTERM): the final save is of ``global_step``, with no done marker."""
        self._finished = False
        self._step = max(self._step, global_step)

    def after_run(self, run_context, run_values):
        """Save when a period has passed (the final save is ``end``'s)."""
        self._step = gs = run_values.global_step
        if gs >= run_context.last_step:
            return
        if self._every.due(gs):
            self.save(gs)

    def end(self, session):
        """The final checkpoint (unless the last one is at this step), then the done marker."""
        # Named by the global step it holds: other trainers' updates may have come after this one's last step
        # (a Keras chief waits for the others' fits before its final save).
        self._step = max(self._step, int(self._call(lambda s: s.run(self._read))))
        if self._step != self._saved_step or self.checkpoint is None:
            self.save(self._step, final=True)
        if self._finished:
            write_done_marker(self.checkpoint_dir, self._step, self.checkpoint)


class IncrementHook(Hook):
    """The chief's incremental saves between the full ones of ``checkpoints`` (a :class:`CheckpointHook`): every
    ``save_steps`` steps or ``save_secs`` seconds, the rows of embedding variables written since the last save
    (:mod:`tfcluster.embedding.increments`, through ``increments``)."""

    def __init__(self, call, increments, checkpoints: CheckpointHook, *, save_steps: Optional[int] = None,
                 save_secs: Optional[float] = None, name: str = "chief"):
        self._call, self.increments, self.checkpoints, self.name = call, increments, checkpoints, name
        self._every = Every(steps=save_steps, secs=save_secs)
        self._broken = None     # the full checkpoint whose increments a failed one ended
        self._base = self       # the full checkpoint the period counts from (none seen yet)

    def after_run(self, run_context, run_values):
        """Save an increment a period after the last save of either kind, where there is a full one to add it to."""
        gs = run_values.global_step
        base = self.checkpoints.checkpoint
        if base != self._base:      # a full save (or the first step) starts the period afresh
            self._base = base
            self._every.mark(step_in_name(base) if base else gs)
        if gs >= run_context.last_step or not self._every.due(gs):
            return      # the final save is a full one
        self._every.mark(gs)
        # No chain to add to: before the first full save, after a failed one (it took the marks of what was
        # written), after a failed increment, or at the full save's own step.
        if base is None or self.checkpoints.failed or base == self._broken or gs == step_in_name(base):
            return
        self.save(base, gs)

    def save(self, base: str, step: int) -> Optional[str]:
        """Write the increment of full checkpoint ``base`` at ``step``; a failure is one line, and increments wait
        for the next full save."""
        from ..embedding.increments import increments_dir
        try:
            path = self._call(lambda s: self.increments.save(s, base, step))
        except (OSError, _op_error()) as e:
            self._broken = base
            prefix = os.path.join(increments_dir(base), CHECKPOINT_NAME)
            remove_partial(os.path.dirname(prefix), f"{prefix}-{step}")
            log.warning("%s could not save the increment of %s at step %d (%s: %s); increments resume after the "
                        "next full checkpoint", self.name, os.path.basename(base), step, type(e).__name__,
                        summary(e))
            return None
        log.info("%s saved increment %s of %s", self.name, os.path.basename(path), os.path.basename(base))
        return path


class TableRowsHook(Hook):
    """The chief's count of the embedding-variable rows on each ps, every ``every_secs``, noted for the launcher's
    line about a ps killed for memory (graph/placement.py's ``record_ps_rows``)."""

    def __init__(self, call, graph, every_secs: float = ROWS_EVERY_SECS):
        self._call, self.graph = call, graph
        self._every = Every(secs=every_secs, at_first=True)
        self._count = None

    def begin(self):
        """The count's ops: each ps's tables' sizes, summed."""
        from ..embedding.variable import rows_per_ps
        self._count = rows_per_ps(self.graph) or None

    def after_run(self, run_context, run_values):
        """Count now and then (a few small reads, one per ps)."""
        gs = run_values.global_step
        if self._count is None or not self._every.due(gs):
            return
        self._every.mark(gs)
        from ..graph.placement import record_ps_rows
        try:
            record_ps_rows(self._call(lambda s: s.run(self._count)), gs)
        except _op_error():     # a ps gone: the launcher's line then gives the last count
            pass


class TrainersDone(Hook):
    """Counts the trainers whose training ended; the chief waits (bounded) until all of them did.

    So the chief's final checkpoint holds every trainer's updates: an async
    trainer may still be running the step it began before the global step
    reached the target, and that update must not land after the final save.
    Put it before the :class:`CheckpointHook`. The k-th ``what`` (training,
    fit) of every trainer of a program is the same one: one counter each,
    beside the global step, not checkpointed. ``every_trainer_waits``: the others wait
    too (Keras: every trainer's model ends its fit with the same weights).
    ``still_secs``: stop waiting once the global step has not moved for that
    long (the missing trainers died; ``fit`` and the Estimator, whose trainers
    stop within a step of each other, not Keras, whose validation runs no step).
    ``session``: the training session, whose recovering ``call`` runs the
    counter's reads: a ps lost while a trainer waits here is recovered as in a
    step, and the trainer counts itself again, since the restored ps starts
    the counter (not checkpointed) at 0.
    """

    def __init__(self, train_graph, trainers: int, is_chief: bool, name: str, session, *,
                 every_trainer_waits: bool = False, still_secs: Optional[float] = None, what: str = "training"):
        self.train_graph, self.number, self.trainers = train_graph, next(_ends_counted[what]), trainers
        self.session = session
        self._counted_in = None     # the session's recovery count when this trainer was last counted
        self.waits = is_chief or every_trainer_waits
        self.is_chief, self.name, self.still_secs, self.what = is_chief, name, still_secs, what
        self.at_most = FINISH_TIMEOUT_SECS

    def begin(self):
        """The counter, shared state the chief creates."""
        import tensorflow as tf
        tf1 = tf.compat.v1
        gs = self.train_graph.global_step
        with tf1.device(gs.device):
            done = tf1.Variable(0, dtype=tf.int64, trainable=False, collections=[], use_resource=True,
                                name=f"tfcluster_{self.what}_{self.number}_done")
        self._count, self._read = done.assign_add(1), [done.read_value(), gs.read_value()]
        self.train_graph.add_state(done)

    def interrupted(self, global_step: int):
        """A SIGTERM stops every trainer at once: wait only briefly for the others."""
        self.at_most = 5.0

    def _counted(self) -> int:
        """Count this trainer's end on the ps; the count with it."""
        done = int(self.session.call(lambda s: s.run(self._count)))
        self._counted_in = self.session.recoveries
        return done

    def end(self, session):
        """Count this trainer's end, then wait for the others' (before the checkpoint hook's end)."""
        done = self._counted()
        if not self.waits:
            return
        started = moved = time.monotonic()
        said, step = 0.0, None
        while done < self.trainers:
            now = time.monotonic()
            waited = now - started
            still = self.still_secs is not None and now - moved > self.still_secs
            if waited > self.at_most or still:
                why = (f"the global step has not moved for {self.still_secs:g}s" if still
                       else f"after {self.at_most:g}s")
                log.warning("%s %s without the %d trainer(s) still in their %s (%s)", self.name,
                            "saves" if self.is_chief else "goes on", self.trainers - done, self.what, why)
                return
            if waited - said >= 10:
                said = waited
                log.info("%s waits for %d trainer(s) to finish their %s (%.0fs)", self.name, self.trainers - done,
                         self.what, waited)
            time.sleep(0.1)
            done, gs = (int(v) for v in self.session.call(lambda s: s.run(self._read)))
            if self.session.recoveries != self._counted_in:
                log.info("%s counts its end again: the ps restored from a checkpoint does not hold the count",
                         self.name)
                done = self._counted()
            if gs != step:
                step, moved = gs, time.monotonic()


def trainers_done(train_graph, cluster, is_chief: bool, name: str, session, **options) -> list:
    """``[TrainersDone(...)]`` where the trainers share a global step on a ps, else ``[]`` (nothing to wait for)."""
    if cluster is None or cluster.num_replicas < 2 or "/job:ps" not in train_graph.global_step.device:
        return []
    return [TrainersDone(train_graph, cluster.num_replicas, is_chief, name, session, **options)]


class SummaryHook(Hook):
    """TensorBoard summaries: ``summary_op`` every ``every_steps`` of this process's steps."""

    def __init__(self, writer, summary_op, every_steps: int):
        self.writer, self.summary_op = writer, summary_op
        self._every = Every(steps=every_steps, at_first=True)

    def before_run(self, run_context):
        """Fetch the summary with every ``every_steps``-th step (the first included)."""
        if self._every.due(run_context.local_steps):
            self._every.mark(run_context.local_steps)
            return RunArgs(self.summary_op)
        return None

    def after_run(self, run_context, run_values):
        """Write the summary fetched with the step."""
        if run_values.results is not None:
            self.writer.add_summary(run_values.results, run_values.global_step)


def _clock(seconds: float) -> str:
    """``0:12``, ``4:05``, ``1:02:03``: a duration as a person reads it."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class ProgressHook(Hook):
    """Progress lines: the first step, then every ``every_secs``: steps, loss, steps/s, examples/s.

    ``worker:0 step 120 (global 240) 40% of 600, ETA 0:12 | loss 0.2345 | 8.1 steps/s 259 examples/s``:
    this process's steps, the global step, and, when the loop has a target
    (``run_context.last_step``), how far along it is and when it should end at
    the cluster's pace so far. ``examples_per_step``: examples one step of this
    process consumes. Throughput also goes to ``writer`` (TensorBoard) when
    given. Its figures (loss over the last window, steps/s over the run) end up
    in ``fit``'s result. The exact time of the first step is a debug line
    (``t=<epoch seconds>``), for tools that measure start-up.
    """

    def __init__(self, name: str, every_secs: float, examples_per_step: int, started: float, writer=None):
        self.name, self.every_secs, self.batch = name, every_secs, examples_per_step
        self.started, self.writer = started, writer
        self.first_step_at = self.last_step_at = None
        self.loss = math.nan
        self.seconds = 0.0
        self.steps = 0
        self.target = math.inf
        self._t0 = None
        self._pace_from = None          # (monotonic time, global step) of the first step

    def after_create_session(self, session, coord):
        """The clock starts when the first session is ready."""
        if self._t0 is None:
            self._t0 = self._window_t = time.monotonic()
            self._every = Every(secs=self.every_secs, clock=lambda: time.monotonic())
            self._every.mark(0)
            self._window = [0.0, 0, 0]      # loss sum, losses counted, steps

    def after_run(self, run_context, run_values):
        """Count the step; log the first one, then one line per window."""
        now = time.monotonic()
        self.steps += 1
        self.seconds = now - self._t0
        self._window[2] += 1
        if run_values.loss == run_values.loss:  # a step whose wait timed out has no loss
            self._window[0] += run_values.loss
            self._window[1] += 1
        self.target = run_context.last_step
        if self.first_step_at is None:
            self.first_step_at = time.time()
            self._pace_from = (now, run_values.global_step)
            log.info("%s first step done %.1fs after start, global step %d", self.name, now - self.started,
                     run_values.global_step)
            log.debug("%s first step done at t=%.3f", self.name, self.first_step_at)
        if self._every.due(self.steps):
            self._log_window(now, run_values.global_step)

    def _how_far(self, now, gs) -> str:
        """`` 40% of 600, ETA 0:12`` when the target is known (the ETA once the global step has moved)."""
        if not math.isfinite(self.target) or self.target <= 0:
            return ""
        text = f" {min(100, int(100 * gs / self.target))}% of {int(self.target)}"
        t0, gs0 = self._pace_from
        if gs > gs0 and now > t0:
            text += f", ETA {_clock(max(0, self.target - gs) * (now - t0) / (gs - gs0))}"
        return text

    def _log_window(self, now, gs):
        total, counted, steps = self._window
        sps = steps / (now - self._window_t)
        loss = total / counted if counted else math.nan
        log.info("%s step %d (global %d)%s | loss %.4f | %.1f steps/s %.0f examples/s", self.name, self.steps, gs,
                 self._how_far(now, gs), loss, sps, sps * self.batch)
        if self.writer is not None:
            self.writer.add_summary(scalar_summary({"steps_per_sec": sps, "examples_per_sec": sps * self.batch}), gs)
        self._window, self._window_t = [0.0, 0, 0], now
        self._every.mark(self.steps)

    @property
    def steps_per_sec(self) -> float:
        """This process's steps per second over the whole run."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def end(self, session):
        """Close the last window: its mean loss is the run's final loss."""
        self.last_step_at = time.time()
        total, counted, _ = self._window
        self.loss = total / counted if counted else math.nan

    def report(self, global_step: int):
        """Log the run's closing line."""
        sps = self.steps_per_sec
        log.info("%s done: global step %d, %d local step(s) in %.1fs, %.1f steps/s %.0f examples/s", self.name,
                 global_step, self.steps, self.seconds, sps, sps * self.batch)


class TimelineHook(Hook):
    """``(epoch seconds, local steps)`` about every ``every_secs``, and at the end.

    So throughput can be measured over the window in which all workers ran
    (``scripts/bench.py``).
    """

    def __init__(self, every_secs: float = 0.5):
        self.marks = []
        self._every = Every(secs=every_secs, at_first=True)
        self._steps = 0

    def after_run(self, run_context, run_values):
        """Note the step count when a period has passed."""
        self._steps += 1
        if self._every.due(self._steps):
            self.marks.append((time.time(), self._steps))
            self._every.mark(self._steps)

    def end(self, session):
        """The last mark."""
        self.marks.append((time.time(), self._steps))
