"""A task's server: starting it, seeing who else is up, waiting, and ending.

Every wait here has a timeout and says what it waits for, because a TF1
session on a cluster with a missing task otherwise waits forever ("CreateSession
still waiting for response from worker", pitfalls item 1). Parameter servers
end through a shared queue on each ps into which every trainer puts one token
when it is done, the known cure for ps tasks that never exit (pitfalls item 2).
"""

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Optional

from ..core import environment
from ..core.errors import ClusterUnreachableError, PortInUseError, SpecError
from ..core.tferrors import summary
from ..topology.cluster import Cluster, Task, parse_address
from ..topology.ports import port_holder, port_is_free
from ..topology.taskenv import import_tensorflow, native_logs_quiet, native_stderr_silenced

log = logging.getLogger("tfcluster")

_PROXY_VARS = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY", "HTTP_PROXY")


def bypass_proxy_for(cluster: Cluster):
    """Keep gRPC from sending cluster traffic through an HTTP proxy (tensorflow/tensorflow#24887)."""
    if not any(os.environ.get(v) for v in _PROXY_VARS):
        return
    hosts = {parse_address(a)[0] for addrs in cluster.jobs.values() for a in addrs}
    current = [h for h in os.environ.get("no_grpc_proxy", "").split(",") if h]
    os.environ["no_grpc_proxy"] = ",".join(sorted(set(current) | hosts))


def start_server(cluster: Cluster, task: Optional[Task] = None, config=None):
    """Start the ``tf.compat.v1.train.Server`` of a task, with its device filters.

    A busy port raises :class:`PortInUseError` naming the task, the port and,
    where psutil can tell, the process that holds it.
    """
    t = cluster.this_task(task)
    if t.job == "evaluator":
        raise SpecError("the evaluator runs outside the cluster and has no server")
    host, port = parse_address(cluster.address(t))
    # A launcher that holds the port for us sets TF_GRPC_REUSE_PORT; then the
    # bind test would see its placeholder, so leave the verdict to TF.
    if os.environ.get("TF_GRPC_REUSE_PORT") != "1" and not port_is_free(port, host):
        raise _port_in_use(t, port)
    bypass_proxy_for(cluster)
    tf = import_tensorflow()
    tf1 = tf.compat.v1
    config = config or cluster.session_config(t)
    try:
        with native_stderr_silenced(native_logs_quiet()):
            server = tf1.train.Server(cluster.to_cluster_spec(), job_name=t.job, task_index=t.index,
                                      config=config, start=True)
    except tf.errors.UnknownError as e:
        if "Could not start gRPC server" in str(e):
            raise _port_in_use(t, port) from None
        raise
    log.info("%s serving on %s", t, cluster.address(t))
    return server


def _port_in_use(task: Task, port: int) -> PortInUseError:
    holder = port_holder(port)
    who = f" (held by {holder})" if holder else ""
    return PortInUseError(f"port {port} of {task.device} is already in use{who}")


_HOSTED = {}   # this process's servers, by (cluster, task): a task's server is started once


def task_server(cluster: Cluster, config=None):
    """This process's server for its task of ``cluster``, started on first use and reused afterwards.

    A gRPC server cannot be stopped (TF's Server.stop is unimplemented), so
    code that trains more than once in a process (Estimator.train called
    again, several Keras fits) must share the first one.
    """
    key = (tuple(sorted((j, tuple(a)) for j, a in cluster.jobs.items())), cluster.this_task())
    if key not in _HOSTED:
        _HOSTED[key] = start_server(cluster, config=config)
    return _HOSTED[key]


def server_from_tf_config(timeout: float = 120.0, environ=None):
    """The one call a TF1 script needs: read TF_CONFIG, start its server, wait for the ps.

    Returns ``(cluster, server)``; ``server`` is None for the evaluator.
    """
    cluster = Cluster.from_tf_config(environ)
    if cluster.task.job == "evaluator":
        return cluster, None
    server = start_server(cluster)
    wait_for_cluster(cluster, timeout=timeout)
    return cluster, server


# ------------------------------------------------------------------ readiness
def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except (socket.gaierror, UnicodeError):
        return False


def probe(cluster: Cluster, tasks=None, timeout: float = 1.0) -> dict:
    """Which tasks answer on gRPC: ``{task: "up" | "down" | "unresolvable"}``."""
    import grpc
    tasks = list(cluster.tasks() if tasks is None else tasks)
    result, calls, channels = {}, {}, []
    for t in tasks:
        host, port = parse_address(cluster.address(t))
        if not _resolves(host):
            result[t] = "unresolvable"
            continue
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        ch = grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)])
        channels.append(ch)
        # A call no server implements: any gRPC server answers it at once
        # (UNIMPLEMENTED), and it waits for a connection until the deadline.
        # (channel_ready_future would do, but closing a channel it watched
        # takes 0.2 s, on every probe of every start.)
        calls[t] = ch.unary_unary(_PROBE_METHOD).future(b"", timeout=timeout, wait_for_ready=True)
    for t, call in calls.items():
        try:
            call.result()
            result[t] = "up"
        except grpc.RpcError as e:
            result[t] = "down" if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                               grpc.StatusCode.UNAVAILABLE) else "up"
    for ch in channels:
        ch.close()
    return {t: result[t] for t in tasks}


#: The method a probe calls; no server has it.
_PROBE_METHOD = "/tfcluster.Probe/AreYouThere"


def _describe_missing(cluster, states) -> str:
    parts = []
    for t, state in states.items():
        why = " (host does not resolve)" if state == "unresolvable" else ""
        parts.append(f"{t.device} at {cluster.address(t)}{why}")
    return ", ".join(parts)


def wait_for_cluster(cluster: Cluster, task: Optional[Task] = None, timeout: float = 120.0,
                     tasks=None, log_every: float = 5.0, stop: Optional[threading.Event] = None):
    """Wait until the tasks ``task`` needs (its ps tasks) answer, or fail naming the missing ones."""
    needed = list(tasks if tasks is not None else cluster.needed_tasks(task))
    if not needed:
        return
    start = time.monotonic()
    deadline = start + timeout
    next_log = start + min(log_every, 1.0)
    while True:
        left = deadline - time.monotonic()
        states = probe(cluster, needed, timeout=max(0.05, min(1.0, left)))
        missing = {t: s for t, s in states.items() if s != "up"}
        if not missing:
            log.debug("all %d needed task(s) are up after %.1fs", len(needed), time.monotonic() - start)
            return
        now = time.monotonic()
        if now >= deadline:
            raise ClusterUnreachableError(
                f"gave up after {timeout:g}s waiting for {_describe_missing(cluster, missing)}",
                missing=list(missing))
        if stop is not None and stop.is_set():
            raise ClusterUnreachableError("stopped while waiting for " + _describe_missing(cluster, missing),
                                          missing=list(missing))
        if now >= next_log:
            log.info("waiting for %s (%.0fs of %gs)", _describe_missing(cluster, missing), now - start, timeout)
            next_log = now + log_every
        needed = list(missing)
        time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))


# ------------------------------------------------------------------- ending
_DONE_CAPACITY = 4096
#: Seconds a ps stays up after the last done token, so the sender hears back.
_DONE_LINGER = 2.0


def _done_queue(ps: Task):
    import tensorflow as tf
    tf1 = tf.compat.v1
    # Both sides must declare the queue identically: same shared_name, type,
    # shape and capacity, or TF refuses to share it.
    with tf1.device(ps.device):
        return tf1.FIFOQueue(_DONE_CAPACITY, [tf.string], shapes=[[]],
                             shared_name=f"tfcluster_done_{ps.job}_{ps.index}", name="tfcluster_done")


#: Seconds a ps serves on after its SIGTERM while a trainer still answers (Kubernetes' default grace).
STOP_GRACE = 30.0


def drain_on_sigterm(cluster: Cluster, stop: threading.Event, grace: float = STOP_GRACE):
    """A ps's ``hold(signum)``: its first SIGTERM keeps it serving while a trainer answers (at most ``grace`` s).

    A scheduler sends SIGTERM to every task at once; a ps that left at once
    would take the model with it while the chief writes its last checkpoint
    (preemption.py). Once no trainer answers, or after ``grace``, it sets
    ``stop``. Returns True when it took the signal over; a second SIGTERM, or
    another signal, is the caller's to stop on at once.
    """
    draining = []

    def drain():
        deadline = time.monotonic() + grace
        while not stop.is_set() and time.monotonic() < deadline:
            if "up" not in probe(cluster, cluster.trainers(), timeout=0.5).values():
                break
            stop.wait(0.5)
        stop.set()

    def hold(signum) -> bool:
        import signal
        if signum != signal.SIGTERM or draining or grace <= 0:
            return False
        log.info("%s got SIGTERM: serving on while a trainer still answers (at most %gs), so the chief can "
                 "write its last checkpoint", cluster.task, grace)
        draining.append(threading.Thread(target=drain, name="tfcluster-drain", daemon=True))
        draining[0].start()
        return True
    return hold


@contextlib.contextmanager
def _sigterm_drains(cluster: Cluster, stop: threading.Event, grace: float):
    """While a library caller serves (fit's, the Estimator's, Keras's ps role): SIGTERM drains, then stops."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hold = drain_on_sigterm(cluster, stop, grace)

    def handler(signum, _frame):
        if not hold(signum):
            stop.set()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def serve_until_done(server, cluster: Cluster, task: Optional[Task] = None,
                     stop: Optional[threading.Event] = None, exit_when_done: bool = True,
                     stop_grace: float = STOP_GRACE) -> str:
    """Host a ps task until every trainer has said it is done, or ``stop`` is set.

    Without a ``stop`` of the caller's, a SIGTERM stops it once no trainer
    answers, at most ``stop_grace`` s later (:func:`drain_on_sigterm`).
    Returns ``"done"`` or ``"stopped"``.
    """
    if stop is None:
        stop = threading.Event()
        with _sigterm_drains(cluster, stop, stop_grace):
            return _serve(server, cluster, task, stop, exit_when_done)
    return _serve(server, cluster, task, stop, exit_when_done)


def _serve(server, cluster: Cluster, task: Optional[Task], stop: threading.Event, exit_when_done: bool) -> str:
    import tensorflow as tf
    tf1 = tf.compat.v1
    t = cluster.this_task(task)
    if not exit_when_done:
        stop.wait()
        return "stopped"
    expected = {str(x) for x in cluster.trainers()}
    graph = tf1.Graph()
    with graph.as_default():
        dequeue = _done_queue(t).dequeue()
    seen = set()
    options = tf1.RunOptions(timeout_in_ms=300)
    with tf1.Session(server.target, graph=graph, config=cluster.session_config(t)) as sess:
        while not stop.is_set():
            try:
                who = sess.run(dequeue, options=options).decode()
            except tf.errors.DeadlineExceededError:
                continue
            if who in expected and who not in seen:
                seen.add(who)
                log.info("%s is done (%d of %d)", who, len(seen), len(expected))
            if seen >= expected:
                log.info("every trainer is done; %s exits", t)
                # The last trainer's enqueue reply and session close are
                # still in flight; leaving at once made it wait out its RPC
                # deadline. A launcher's SIGTERM cuts this wait short.
                stop.wait(_DONE_LINGER)
                return "done"
    return "stopped"


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
    if "up" not in states.values():
        log.debug("no ps of %s is up; none needs a done signal", ", ".join(map(str, ps_tasks)))
        return 0
    tf = import_tensorflow()
    tf1 = tf.compat.v1
    told = 0
    for ps in ps_tasks:
        if states[ps] != "up":
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
            if probe(cluster, [ps], timeout=1.0)[ps] != "up":
                # It exited while we spoke: the last token it needed came from elsewhere.
                log.debug("%s exited before %s's done signal reached it; it needs none", ps, t)
                continue
            log.warning("could not tell %s that %s is done: %s", ps, t, summary(e))
    return told


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
