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
TF reports it in one of two forms, whichever of its two ways of ending the
step's other parts wins a race: an ``AbortedError`` carrying the rejecting
task's message, or a ``CancelledError`` of a part that was waiting on the
rejected one, with the rejection after it (``CANCELLED: ...
RecvFromRemoteAsync is cancelled``, then ``ABORTED: From /job:ps/...: The same
RunGraph (Worker) request was received twice``; issue 67: a third of them in
tests/test_false_duplicates.py). Both carry the rejection's text, and only the
rejection does: that text is what :func:`is_false_duplicate` reads.

Every run is rerun through :func:`rerun`, with the same limit,
:data:`ATTEMPTS`: a session layer (:func:`rerun_in_every_session`) wraps
``Session.run`` and the callables ``make_callable`` makes, installed by TF1
mode and by every training session (fit, the Estimator, Keras), so a step, a
checkpoint's save, a hook's read, a queue runner's step and the ps's done
signal are all covered. A sync chief's step decides for itself
(:func:`reruns_its_own`): it must not apply an update twice. A rerun costs
nothing: what a trainer's part reads is gated on its ps tasks having taken
the step (:mod:`tfcluster.graph.gate`), so the rerun trains the batch the
rejected step would have. :func:`met` counts them; a trainer's run ends with
the count (:func:`say_met`) where it met any.
"""

import contextlib
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
    """True for a TF error that carries a task's "The same RunGraph (Worker) request was received twice", in any
    of the forms TF reports it (an ``AbortedError``, a ``CancelledError`` of the step's other part; module doc)."""
    import tensorflow as tf
    return isinstance(error, tf.errors.OpError) and DUPLICATE_MARK in str(error)


_met = [0]
_met_lock = threading.Lock()


def note_met():
    """Count one false duplicate met (see :func:`met`)."""
    with _met_lock:
        _met[0] += 1


def met() -> int:
    """How many false duplicates this process met: each one a run TF rejected, and ran again."""
    return _met[0]


def say_met(name: str, since: int = 0):
    """The line that ends ``name``'s run where it met false duplicates (``met() - since`` of them): how many, and
    that each was run again."""
    count = met() - since
    if count:
        log.info("%s: TF falsely rejected %d run(s) as duplicate requests (TF 2.21's 32-bit request ids, pitfalls "
                 "item 15); each was run again", name, count)


def warn_rerun(attempt: int, attempts: int = ATTEMPTS, what: str = "a step"):
    """Say that ``what`` is run again as attempt ``attempt`` of ``attempts`` (and count the false duplicate)."""
    note_met()
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
#: ``.active`` on a thread inside :func:`reruns_its_own`.
_own = threading.local()


@contextlib.contextmanager
def reruns_its_own():
    """The runs this thread makes inside are not rerun by the session layer: their caller decides what a false
    duplicate means (a sync chief's step, which must never apply twice: strategies/sync_run.py)."""
    outer = getattr(_own, "active", False)
    _own.active = True
    try:
        yield
    finally:
        _own.active = outer


def _rerunning(fn, attempts=ATTEMPTS):
    """``fn`` that reruns false duplicates and notes the preemption it lets through."""
    import tensorflow as tf
    preemptions = (tf.errors.AbortedError, tf.errors.UnavailableError)

    def run(*args, **kwargs):
        if getattr(_own, "active", False):
            return fn(*args, **kwargs)
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
    lambda session, fn: _rerunning(fn), "TF1 mode; every training session (training/session.py)"))


def rerun_in_every_session():
    """Make every ``Session.run``, and every callable ``Session.make_callable`` makes, rerun false duplicates.

    Queue runners step through ``make_callable`` in threads of their own; the
    other threads' steps make their collisions come faster, not rarer.
    """
    patches.add_session_layer("rerun-false-duplicates")
