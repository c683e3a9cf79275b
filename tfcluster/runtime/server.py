"""A task's server: starting it, and seeing who else is up, within a timeout.

Every wait here has a timeout and says what it waits for, because a TF1
session on a cluster with a missing task otherwise waits forever ("CreateSession
still waiting for response from worker", pitfalls item 1). How a ps ends is
:mod:`.shutdown`.
"""

import enum
import logging
import os
import socket
import threading
import time
from typing import Optional

from ..core.errors import ClusterUnreachableError, PortInUseError, SpecError
from ..topology.cluster import Cluster, Role, Task, parse_address
from ..topology.ports import port_holder, port_is_free
from ..topology.taskenv import import_tensorflow, native_logs_quiet, native_stderr_silenced

log = logging.getLogger("tfcluster")

_PROXY_VARS = ("grpc_proxy", "https_proxy", "http_proxy", "GRPC_PROXY", "HTTPS_PROXY", "HTTP_PROXY")


#: Seconds between a waiting worker's "is the model ready?" polls (SessionManager's default is 30;
#: pitfalls item 4): its first step follows the chief's within about a second. TF1 mode's too.
READY_POLL_SECS = 0.2
#: Seconds a task's server waits at most for the ps tasks it needs (``tfcluster start --timeout``).
CLUSTER_WAIT_SECS = 120.0


class TaskState(str, enum.Enum):
    """What a probe found at a task's address (a string too: ``probe(...)[task] == "up"`` still holds)."""

    UP = "up"
    DOWN = "down"
    UNRESOLVABLE = "unresolvable"       # its host name does not resolve

    def __str__(self):
        return self.value


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
    if t.role is Role.EVALUATOR:
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


_LOCAL_SESSIONS = []   # (server, config) that sessions made without a target run on (Horovod's programs)


def serve_local_sessions(server, config) -> None:
    """Sessions this process makes without a target (``''``) run on ``server``, with ``config`` under theirs.

    Horovod's programs open local sessions and let Horovod's own ops talk to the
    other processes; tfcluster's all-reduce is TF's collectives, which run only
    in a session on this task's server (tfcluster/horovod/tensorflow.py).
    """
    _LOCAL_SESSIONS[:] = [(server, config)]


def local_session_default():
    """``(server, config)`` for a session made without a target, or None: it stays local."""
    return _LOCAL_SESSIONS[0] if _LOCAL_SESSIONS else None


def server_from_tf_config(timeout: float = CLUSTER_WAIT_SECS, environ=None):
    """The one call a TF1 script needs: read TF_CONFIG, start its server, wait for the ps.

    Returns ``(cluster, server)``; ``server`` is None for the evaluator.
    """
    cluster = Cluster.from_tf_config(environ)
    if cluster.task.role is Role.EVALUATOR:
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
    """Which tasks answer on gRPC: ``{task: TaskState}``."""
    import grpc
    tasks = list(cluster.tasks() if tasks is None else tasks)
    result, calls, channels = {}, {}, []
    for t in tasks:
        host, port = parse_address(cluster.address(t))
        if not _resolves(host):
            result[t] = TaskState.UNRESOLVABLE
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
            result[t] = TaskState.UP
        except grpc.RpcError as e:
            result[t] = TaskState.DOWN if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                                       grpc.StatusCode.UNAVAILABLE) else TaskState.UP
    for ch in channels:
        ch.close()
    return {t: result[t] for t in tasks}


#: The method a probe calls; no server has it.
_PROBE_METHOD = "/tfcluster.Probe/AreYouThere"


def _describe_missing(cluster, states) -> str:
    parts = []
    for t, state in states.items():
        why = " (host does not resolve)" if state is TaskState.UNRESOLVABLE else ""
        parts.append(f"{t.device} at {cluster.address(t)}{why}")
    return ", ".join(parts)


def wait_for_cluster(cluster: Cluster, task: Optional[Task] = None, timeout: float = CLUSTER_WAIT_SECS,
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
        missing = {t: s for t, s in states.items() if s is not TaskState.UP}
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
