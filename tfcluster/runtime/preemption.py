"""Preemption: a SIGTERM to a training task ends its step, writes a checkpoint and exits, losing nothing.

Schedulers stop jobs with SIGTERM and kill them a grace period later
(Kubernetes 30 s, Slurm's KillWait 30 s, ``tfcluster local --stop-grace``).
TF 1.x training installed no handler, so SIGTERM killed it mid-step and
every step since the last periodic checkpoint was lost. While the training
loop runs (:func:`tfcluster.training.loop.run_loop`), :class:`SigtermWatch` notes the
signal instead; the loop stops after the step in flight (a sync wait looks
up every few seconds and gives up its step), every hook's ``end`` runs, so
the chief writes its final checkpoint, and :class:`Preempted` ends the
program with exit code 143, as the signal would have: Kubernetes' TFJob
``ExitCode`` restart policy and Slurm's requeue read 128+N as "retry". A
second SIGTERM ends the process at once, unless it comes within
:data:`REPEAT_SECS` of the first: Slurm with cgroup tracking signals every
process of a step, and ``tfcluster start`` forwards the same signal again.

No done token is sent to the ps tasks: a preempted trainer is coming back
(``tfcluster start`` hosting a ps keeps serving on its own SIGTERM while any
trainer still answers, so the chief can save).

The input pipeline restarts on resume: each worker's dataset is rebuilt and
read from the start of its shard (tf.data iterator state lives in each
worker's own process and is not in the chief's checkpoint), so a resumed run
replays data it has seen, as TF 1.x's MonitoredTrainingSession did after any
restart. Shuffle with a seed that differs per run, or use epochs, if that
matters.
"""

import logging
import os
import signal
import threading
import time
from typing import Optional

from ..core import posix

log = logging.getLogger("tfcluster")

#: The exit code of a preempted trainer: 128 + SIGTERM, what the signal itself would have given.
PREEMPTED_EXIT = 128 + signal.SIGTERM
#: Seconds a scheduler gives a task between SIGTERM and SIGKILL (Kubernetes' default grace, Slurm's
#: KillWait): a ps hosted by tfcluster serves on that long while a trainer answers, and ``tfcluster local``
#: gives each task that long before SIGKILL (``--stop-grace``).
STOP_GRACE_SECS = 30.0
#: A SIGTERM this soon after the first is the same stop delivered twice, not a demand to stop now.
REPEAT_SECS = 2.0


class Preempted(SystemExit):
    """A SIGTERM stopped training after its checkpoint: the program exits 143 (no traceback, like the signal)."""

    def __init__(self, message: str):
        super().__init__(PREEMPTED_EXIT)
        self.message = message

    def __str__(self):
        return self.message


class StepInterrupted(Exception):
    """A wait inside a step was given up because the task was asked to stop (internal to the loop)."""


class SigtermWatch:
    """While entered (in the main thread), a SIGTERM is noted, not fatal; ``check`` raises once it came."""

    def __init__(self):
        self.at: Optional[float] = None        # monotonic time of the first SIGTERM
        self._previous = {}

    def __enter__(self):
        self._previous = posix.take_signals(self._on_sigterm, (signal.SIGTERM,))
        if threading.current_thread() is not threading.main_thread():
            log.debug("training runs outside the main thread: SIGTERM stops it at once, without a checkpoint")
        return self

    def __exit__(self, *exc):
        # Stopping already: the handler stays, so the same stop delivered twice cannot kill the exit.
        if self.at is None:
            posix.give_back_signals(self._previous)
        self._previous = {}
        return False

    def _on_sigterm(self, signum, frame):
        if self.at is not None and time.monotonic() - self.at >= REPEAT_SECS:
            # Asked twice: stop now, as the signal would have.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.at is None:
            self.at = time.monotonic()

    @property
    def requested(self) -> bool:
        """True once a SIGTERM came."""
        return self.at is not None

    def check(self):
        """Raise :class:`StepInterrupted` once a SIGTERM came (a long wait calls this as it waits)."""
        if self.at is not None:
            raise StepInterrupted()
