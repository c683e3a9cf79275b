"""The training loop: step a training session until its target, with hooks around every step.

The loop is all that ``fit``, the Estimator and graph-mode Keras share of
training: ask each hook what to fetch along (``before_run``), run one step
through the :class:`~tfcluster.training.session.TrainingSession` (which reruns
false duplicates and recovers a lost session, bounded), hand each hook its
results (``after_run``), until the global step reaches the target, a hook asks
to stop, or the input runs out (``OutOfRangeError``, as for TF's
MonitoredSession), or a SIGTERM comes (:mod:`tfcluster.runtime.preemption`:
the step in flight ends, then :class:`~tfcluster.runtime.preemption.Preempted`);
then every hook's ``end``. Checkpoints, summaries and progress lines are hooks
(:mod:`tfcluster.training.hooks`). :func:`run_loop` drives the loop to a target;
tf-keras's ``fit`` drives it a step at a time (:class:`TrainingLoop`), with its
own epochs and callbacks around.
"""

import logging
import os
import time
from typing import Optional

from ..core import duplicates
from ..graph.step import RunArgs, StepContext, StepValues
from ..runtime.preemption import Preempted, SigtermWatch, StepInterrupted
from .hooks import CheckpointHook

log = logging.getLogger("tfcluster")


def merge_requests(requests) -> Optional[RunArgs]:
    """One RunArgs for the hooks that asked: their fetches as a list, feeds joined, options merged.

    Options merge as TF's MonitoredSession merges them: the deepest trace,
    the shortest timeout, partition graphs if any hook wants them.
    """
    asked = [r for r in requests if r is not None]
    if not asked:
        return None
    feeds, options = {}, None
    for r in asked:
        for key, value in (r.feed_dict or {}).items():
            if key in feeds:
                raise ValueError(f"two hooks feed the same tensor {getattr(key, 'name', key)}")
            feeds[key] = value
        if r.options is not None:
            options = _merge_options(options, r.options)
    return RunArgs([r.fetches for r in asked], feeds or None, options)


def _merge_options(a, b):
    if a is None:
        return b
    import tensorflow as tf
    merged = tf.compat.v1.RunOptions()
    merged.CopyFrom(a)
    merged.trace_level = max(a.trace_level, b.trace_level)
    timeouts = [t for t in (a.timeout_in_ms, b.timeout_in_ms) if t > 0]
    merged.timeout_in_ms = min(timeouts) if timeouts else 0
    merged.output_partition_graphs = a.output_partition_graphs or b.output_partition_graphs
    return merged


def _values_for(requests, result):
    """Each hook's StepValues: its own results, or None if it asked for nothing."""
    out, k = [], 0
    for r in requests:
        mine = None
        if r is not None:
            # A sync step that stalled and was resumed has no results: its hooks get None.
            mine = result.results[k] if result.results is not None else None
            k += 1
        out.append(StepValues(mine, r.options if r is not None else None, result.run_metadata,
                              result.global_step, result.loss))
    return out


def run_loop(session, last_step: Optional[int] = None, steps: Optional[int] = None, name: str = "local") -> int:
    """Step ``session`` until global step ``last_step`` (or ``steps`` more steps); returns the final global step.

    With neither, it runs until a hook asks to stop or the input runs out.
    """
    import tensorflow as tf
    with TrainingLoop(session, last_step, steps, name) as loop:
        while not loop.should_stop:
            try:
                loop.step()
            except tf.errors.OutOfRangeError:
                log.info("%s: the input is exhausted at global step %d; training ends", name, loop.global_step)
                break
            except StepInterrupted:      # a sync wait given up for the SIGTERM: the step never happened
                break
        loop.end()
    return loop.global_step


class TrainingLoop:
    """The loop in parts, for a front end whose own loop calls each step (tf-keras's ``fit``).

    Entered, it watches for SIGTERM; :meth:`step` runs one step with every
    hook around it; :meth:`end` runs every hook's ``end`` (the chief's final
    checkpoint). Leaving after a SIGTERM raises
    :class:`~tfcluster.runtime.preemption.Preempted`. :func:`run_loop` is this
    loop driven to a target step.
    """

    def __init__(self, session, last_step: Optional[int] = None, steps: Optional[int] = None, name: str = "local"):
        self.session, self.name = session, name
        self.hooks = session.hooks
        self._last_step, self._steps = last_step, steps
        self.ctx = self.sigterm = None
        self._duplicates = duplicates.met()     # the false duplicates met before this run

    def __enter__(self):
        gs = self.session.global_step()
        last_step = gs + self._steps if self._steps is not None else self._last_step
        runner = self.session.train_graph.runner
        self.ctx = StepContext(self.session, last_step if last_step is not None else float("inf"),
                               RunArgs(runner.train_fetch))
        self.ctx.global_step = gs
        if last_step is not None and gs >= last_step:
            log.info("%s: global step %d already reaches %d; nothing to train", self.name, gs, last_step)
        self.sigterm = SigtermWatch().__enter__()
        runner.on_stall.append(self.sigterm.check)
        return self

    @property
    def global_step(self) -> int:
        """The global step after the last step (or at the start)."""
        return self.ctx.global_step

    @property
    def should_stop(self) -> bool:
        """True once the target step is reached, a hook asked to stop, or a SIGTERM came."""
        ctx = self.ctx
        return ctx.global_step >= ctx.last_step or ctx.stop_requested or self.sigterm.requested

    def step(self):
        """One step with the hooks around it; returns its StepResult."""
        ctx = self.ctx
        requests = [h.before_run(ctx) for h in self.hooks]
        result = self.session.step(merge_requests(requests))
        ctx.global_step = result.global_step
        ctx.local_steps += 1
        for hook, values in zip(self.hooks, _values_for(requests, result)):
            hook.after_run(ctx, values)
        return result

    def end(self):
        """The run ended normally (or on a SIGTERM): every hook's ``end``, after the last save's step is settled."""
        if self.sigterm.requested:
            self.ctx.global_step = _before_the_last_save(self.session, self.hooks, self.name, self.ctx.global_step)
            for hook in self.hooks:
                getattr(hook, "interrupted", lambda step: None)(self.ctx.global_step)     # TF's hooks have none
        for hook in self.hooks:
            hook.end(self.session.session)
        duplicates.say_met(self.name, self._duplicates)

    def __exit__(self, kind, error, tb):
        self.session.train_graph.runner.on_stall.remove(self.sigterm.check)
        self.sigterm.__exit__(kind, error, tb)
        if kind is None and self.sigterm.requested:
            raise Preempted(_preempted(self.name, self.ctx.global_step, self.hooks,
                                       time.monotonic() - self.sigterm.at))
        return False


def _before_the_last_save(session, hooks, name: str, global_step: int, quiet_secs: float = 0.6,
                          at_most: float = 5.0) -> int:
    """Preempted: the global step the last checkpoint holds.

    The chief waits (at most ``at_most`` s) until the global step stops moving:
    the other trainers got the same SIGTERM, and their last steps belong in
    its checkpoint. A trainer that goes on (only the chief was stopped) does
    not hold it longer; its restart joins the live model anyway (chief.py).
    """
    saves = any(isinstance(h, CheckpointHook) for h in hooks)
    if not saves or session.cluster is None or session.cluster.num_replicas < 2:
        return global_step
    started = time.monotonic()
    last, since = session.global_step(), time.monotonic()
    while time.monotonic() - since < quiet_secs and time.monotonic() - started < at_most:
        time.sleep(0.1)
        now = session.global_step()
        if now != last:
            last, since = now, time.monotonic()
    log.debug("%s: the global step settled at %d %.1fs after the stop", name, last, time.monotonic() - started)
    return max(last, global_step)


def _preempted(name: str, global_step: int, hooks, seconds: float) -> str:
    """The line a SIGTERM ends training with: where it stopped, and what holds that step."""
    saving = next((h for h in hooks if isinstance(h, CheckpointHook)), None)
    if saving is None:
        line = (f"{name} stopped on SIGTERM after global step {global_step}, {seconds:.1f}s after the signal "
                "(this task writes no checkpoint)")
    else:
        line = (f"{name} stopped on SIGTERM after global step {global_step}: saved "
                f"{os.path.basename(saving.checkpoint or '?')} {seconds:.1f}s after the signal; a restarted run "
                f"resumes from it")
    log.warning("%s", line)
    return line
