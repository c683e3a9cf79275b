"""How a parameter server ends: every trainer's done token, a drain on SIGTERM, and the trainer's side of it.

A TF 1.x ps sat in ``server.join()`` forever (docs/pitfalls.md, item 2). Here
each ps has a shared queue into which every trainer puts one token when it is
done (:func:`signal_done`); the ps serves until it holds every trainer's token
(:func:`serve_until_done`) and exits. A trainer's run is wrapped in
:func:`done_when_finished`, so it gives its token however it ends, and the
lost chief's too when the chief is gone for good (the ps would wait for it
forever). A scheduler's SIGTERM does not end a ps at once: it serves on while
a trainer answers, so the chief can write its last checkpoint
(:func:`drain_on_sigterm`).
"""

import contextlib
import enum
import logging
import os
import threading
import time
from typing import Optional

from ..core import environment, posix
from ..core.errors import ChiefLostError
from ..core.tferrors import summary
from ..topology.cluster import Cluster, Task
from ..topology.taskenv import import_tensorflow
from .preemption import STOP_GRACE_SECS
from .server import TaskState, probe, task_server

log = logging.getLogger("tfcluster")


class Served(enum.Enum):
    """How :func:`serve_until_done` ended: every trainer is done, or it was stopped (a signal, the caller)."""

    DONE = "all trainers done"
    STOPPED = "stopped"


_DONE_CAPACITY = 4096
#: Seconds a ps stays up after the last done token, so the sender hears back.
_DONE_LINGER = 2.0
#: Seconds between a ps's looks at its done queue.
DONE_POLL_SECS = 0.1
#: Seconds a hosting task's main thread sleeps at most, so a stop signal's handler runs within them.
SIGNAL_POLL_SECS = 0.5


def _done_queue(ps: Task):
    import tensorflow as tf
    tf1 = tf.compat.v1
    # Both sides must declare the queue identically: same shared_name, type,
    # shape and capacity, or TF refuses to share it.
    with tf1.device(ps.device):
        return tf1.FIFOQueue(_DONE_CAPACITY, [tf.string], shapes=[[]],
                             shared_name=f"tfcluster_done_{ps.job}_{ps.index}", name="tfcluster_done")


def drain_on_sigterm(cluster: Cluster, stop: threading.Event, grace: float = STOP_GRACE_SECS,
                     done: Optional[threading.Event] = None):
    """A ps's ``hold(signum)``: its first SIGTERM keeps it serving while a trainer answers (at most ``grace`` s).

    A scheduler sends SIGTERM to every task at once; a ps that left at once
    would take the model with it while the chief writes its last checkpoint
    (preemption.py). Once no trainer answers, or after ``grace``, it sets
    ``stop``; it says it drains only when a trainer answered. Returns True when it took the signal over; a second SIGTERM, or
    another signal, is the caller's to stop on at once. So is a SIGTERM once
    ``done`` is set (:func:`serve_until_done` sets it when every trainer is
    done): that ps is leaving anyway, with no checkpoint left to wait for.
    """
    draining = []

    def drain():
        deadline, said = time.monotonic() + grace, False
        while not stop.is_set() and time.monotonic() < deadline:
            if TaskState.UP not in probe(cluster, cluster.trainers(), timeout=0.5).values():
                break
            if not said:
                # Only when a trainer is there to wait for: the launcher's SIGTERM after its trainers
                # exited stops the ps with no drain to announce.
                log.info("%s got SIGTERM: serving on while a trainer still answers (at most %gs), so the chief "
                         "can write its last checkpoint", cluster.task, grace)
                said = True
            stop.wait(0.5)
        stop.set()

    def hold(signum) -> bool:
        import signal
        if signum != signal.SIGTERM or draining or grace <= 0 or (done is not None and done.is_set()):
            return False
        draining.append(threading.Thread(target=drain, name="tfcluster-drain", daemon=True))
        draining[0].start()
        return True
    return hold


@contextlib.contextmanager
def _sigterm_drains(cluster: Cluster, stop: threading.Event, grace: float, done: threading.Event):
    """While a library caller serves (fit's, the Estimator's, Keras's ps role): SIGTERM drains, then stops."""
    import signal
    hold = drain_on_sigterm(cluster, stop, grace, done)

    def handler(signum, _frame):
        if not hold(signum):
            stop.set()
    previous = posix.take_signals(handler, (signal.SIGTERM,))
    try:
        yield
    finally:
        posix.give_back_signals(previous)


def serve_until_done(server, cluster: Cluster, task: Optional[Task] = None,
                     stop: Optional[threading.Event] = None, exit_when_done: bool = True,
                     stop_grace: float = STOP_GRACE_SECS, done: Optional[threading.Event] = None) -> Served:
    """Host a ps task until every trainer has said it is done, or ``stop`` is set.

    Without a ``stop`` of the caller's, a SIGTERM stops it once no trainer
    answers, at most ``stop_grace`` s later (:func:`drain_on_sigterm`).
    ``done`` is set once every trainer is done (a caller's, to share with
    its :func:`drain_on_sigterm`). Returns how it ended (:class:`Served`).
    """
    done = threading.Event() if done is None else done
    if stop is None:
        stop = threading.Event()
        with _sigterm_drains(cluster, stop, stop_grace, done):
            return _serve(server, cluster, task, stop, exit_when_done, done)
    return _serve(server, cluster, task, stop, exit_when_done, done)


def _serve(server, cluster: Cluster, task: Optional[Task], stop: threading.Event, exit_when_done: bool,
           done: threading.Event) -> Served:
    import tensorflow as tf
    tf1 = tf.compat.v1
    t = cluster.this_task(task)
    if not exit_when_done:
        # Never an untimed wait: a stop signal the kernel hands to another thread (TF's, gRPC's) sets ``stop``
        # only once this, the main thread, runs Python again (tests/test_server.py).
        while not stop.wait(SIGNAL_POLL_SECS):
            pass
        return Served.STOPPED
    expected = {str(x) for x in cluster.trainers()}
    graph = tf1.Graph()
    with graph.as_default():
        queue = _done_queue(t)
        waiting = queue.size()
        count = tf1.placeholder(tf.int32, [])
        take = queue.dequeue_many(count)
    seen = set()
    with tf1.Session(server.target, graph=graph, config=cluster.session_config(t)) as sess:
        while not stop.is_set():
            # Only what is already there is taken, never with a deadline: a dequeue whose run timed out as a
            # token arrived took the token and dropped it, so that trainer was never counted and the ps served
            # on for ever (CI-24's sync run; tests/test_server.py's done-token test fails on that loop).
            n = sess.run(waiting)
            if not n:
                stop.wait(DONE_POLL_SECS)
                continue
            for who in (w.decode() for w in sess.run(take, {count: n})):
                if who in expected and who not in seen:
                    seen.add(who)
                    log.info("%s is done (%d of %d)", who, len(seen), len(expected))
            if seen >= expected:
                # Before the line: a SIGTERM from here on ends the linger below without a drain of its own.
                done.set()
                log.info("every trainer is done; %s exits", t)
                # The last trainer's enqueue reply and session close are
                # still in flight; leaving at once made it wait out its RPC
                # deadline. A launcher's SIGTERM cuts this wait short.
                stop.wait(_DONE_LINGER)
                return Served.DONE
    return Served.STOPPED


#: Set by ``tfcluster start`` for its command: a file where :func:`signal_done` notes each ps it told.
DONE_RECORD_ENV = environment.DONE_RECORD.name


def signal_done(cluster: Cluster, task: Optional[Task] = None, timeout: float = 10.0, ps_tasks=None) -> int:
    """Tell every ps (or those of ``ps_tasks``) that this trainer is done; returns how many ps were told.

    It talks to each ps's own master, so it needs no server of its own and
    works from a finished script, a launcher, or another terminal.
    """
    t = cluster.this_task(task)
    ps_tasks = list(cluster.tasks(("ps",)) if ps_tasks is None else ps_tasks)
    states = probe(cluster, ps_tasks, timeout=min(2.0, timeout))
    if TaskState.UP not in states.values():
        log.debug("no ps of %s is up; none needs a done signal", ", ".join(map(str, ps_tasks)))
        return 0
    tf = import_tensorflow()
    tf1 = tf.compat.v1
    told = 0
    for ps in ps_tasks:
        if states[ps] is not TaskState.UP:
            log.debug("%s is not up; it needs no done signal", ps)
            continue
        graph = tf1.Graph()
        with graph.as_default():
            enqueue = _done_queue(ps).enqueue([str(t)])
        config = tf1.ConfigProto(device_filters=[ps.device], operation_timeout_in_ms=int(timeout * 1000))
        try:
            with tf1.Session(f"grpc://{cluster.address(ps)}", graph=graph, config=config) as sess:
                sess.run(enqueue, options=tf1.RunOptions(timeout_in_ms=int(timeout * 1000)))
            told += 1
            _note_told(ps, t)
        except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError) as e:
            if probe(cluster, [ps], timeout=1.0)[ps] is not TaskState.UP:
                # It exited while we spoke: the last token it needed came from elsewhere.
                log.debug("%s exited before %s's done signal reached it; it needs none", ps, t)
                continue
            log.warning("could not tell %s that %s is done: %s", ps, t, summary(e))
    return told


def serve_as_ps(cluster: Cluster) -> Served:
    """A front end's ps role (fit, the Estimator, Keras): serve this task until every trainer is done."""
    return serve_until_done(task_server(cluster), cluster)


@contextlib.contextmanager
def done_when_finished(cluster: Optional[Cluster], last: bool = True):
    """Around a trainer's training: once it finished, tell every ps that this trainer is done.

    When the chief is lost for good (:class:`~tfcluster.core.errors.ChiefLostError`),
    its token is given too: the ps waits for every trainer's, and the chief's
    would never come. A trainer stopped by any other error gives none: it is
    coming back (a restart, a rerun), and the ps serves on for it. ``last``:
    False where the program may train again after this (a Keras ``fit``): only
    a lost chief then gives tokens; the end of the program gives the rest
    (``tfcluster start`` and ``local`` tell the ps when their command exits 0).
    """
    try:
        yield
    except ChiefLostError:
        if cluster is not None:
            signal_done(cluster)
            signal_done(cluster, task=cluster.chief_task)
        raise
    if last and cluster is not None and cluster.num_tasks("ps"):
        told = signal_done(cluster)
        log.debug("%s told %d ps task(s) it is done", cluster.task, told)


def _note_told(ps: Task, t: Task):
    path = os.environ.get(DONE_RECORD_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{ps} {t}\n")
    except OSError as e:   # the launcher then tells the ps again: slower, not wrong
        log.debug("cannot note in %s that %s was told: %s", path, ps, e)


def told_by_record(path: str, task: Task) -> set:
    """The ps tasks (as text, ``ps:0``) that a record of :data:`DONE_RECORD_ENV` says were told ``task`` is done."""
    try:
        with open(path, encoding="utf-8") as f:
            pairs = [line.split() for line in f]
    except OSError:
        return set()
    return {p[0] for p in pairs if len(p) == 2 and p[1] == str(task)}
