"""TF 2.21's false "request was received twice" aborts, and the one way tfcluster reruns them.

TF 2.21 draws every RunGraph request id from a thread-local Mersenne Twister
seeded with 32 bits from /dev/urandom (``GetUniqueRequestId`` ->
``tsl::random::ThreadLocalNew64``), and the master runs each step on a freshly
spawned thread (``Env::SchedClosure``). So each step's id is, in effect, one
of only 2**32 values, and a worker remembers the last 100,000 ids it received
to reject retried requests: a new id matches a remembered one with
probability about 100,000 / 2**32 = 1 in 43,000 once the window is full, and
the worker answers ``AbortedError: The same RunGraph (Worker) request was
received twice`` although nothing was sent twice (docs/pitfalls.md, item 15;
``scripts/repro_request_twice.py`` reproduces it and checks that rate).

That worker rejected its part of the step before running it. It is no
preemption: the step is rerun, not the session recreated from a checkpoint.
Every place that runs a step (the strategies' runners, the training session,
TF1 mode's ``Session.run``) reruns it through :func:`rerun`, with the same
limit, :data:`ATTEMPTS`; code that runs its own sessions (TF1 scripts, the
Estimator's queue runners) gets the same through :func:`rerun_in_every_session`.
"""

import logging
import threading

from . import patches
from .tferrors import describe

log = logging.getLogger("tfcluster")

#: The text of TF 2.21's false-duplicate abort.
DUPLICATE_MARK = "request was received twice"
#: Runs of one step before a false duplicate is let through (the next one is about 43,000 steps away).
ATTEMPTS = 5


def is_false_duplicate(error) -> bool:
    """True for TF's ``AbortedError: The same RunGraph request was received twice``."""
    import tensorflow as tf
    return isinstance(error, tf.errors.AbortedError) and DUPLICATE_MARK in str(error)


def warn_rerun(attempt: int, attempts: int = ATTEMPTS, what: str = "a step"):
    """Say that ``what`` is run again as attempt ``attempt`` of ``attempts``."""
    log.warning("TF rejected %s as a duplicate request although it was sent once (TF 2.21's 32-bit "
                "request ids, pitfalls item 15); running it again (attempt %d of %d)", what, attempt, attempts)


def rerun(fn, *args, attempts: int = ATTEMPTS, **kwargs):
    """``fn(*args, **kwargs)``, run again (up to ``attempts`` runs in all) while TF rejects it as a false duplicate."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if attempt == attempts or not is_false_duplicate(e):
                raise
            warn_rerun(attempt + 1, attempts)


#: The last Aborted or Unavailable error a patched session let through, per thread (``.text``).
last_failure = threading.local()


def _rerunning(fn, attempts=ATTEMPTS):
    """``fn`` that reruns false duplicates and notes the preemption it lets through."""
    import tensorflow as tf
    preemptions = (tf.errors.AbortedError, tf.errors.UnavailableError)

    def run(*args, **kwargs):
        try:
            return rerun(fn, *args, attempts=attempts, **kwargs)
        except preemptions as e:
            last_failure.text = describe(e)
            raise
    run.__wrapped__ = fn
    run.__doc__ = fn.__doc__
    return run


patches.register_session_layer(patches.SessionLayer(
    "rerun-false-duplicates", 0, "a step TF rejected as a duplicate request although it was sent once is run "
    "again (pitfalls item 15); the preemption it lets through is noted for the recovery warning",
    lambda session, fn: _rerunning(fn), "TF1 mode; the Estimator's training graph"))


def rerun_in_every_session():
    """Make every ``Session.run``, and every callable ``Session.make_callable`` makes, rerun false duplicates.

    Queue runners step through ``make_callable`` in threads of their own; the
    other threads' steps make their collisions come faster, not rarer.
    """
    patches.add_session_layer("rerun-false-duplicates")
