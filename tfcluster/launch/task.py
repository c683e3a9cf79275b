"""One task started on its own (``tfcluster start``, srun, a pod): host its server, or run its command.

With no command the task's server is hosted here: a ps serves until every
trainer is done (:mod:`tfcluster.runtime.shutdown`), a trainer's server waits
for its ps first. With a command, the command runs as the task (TF_CONFIG set,
in its own session), stop signals are forwarded to it, and once it ends well
the ps tasks are told this trainer is done, unless the command told them
itself. The local launcher starts each ps it hosts through this, as
``tfcluster start`` (launch/plan.py).
"""

import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading

from ..core import environment, posix
from ..core.errors import ClusterUnreachableError, TfclusterError
from ..core.exits import exit_status
from ..runtime.preemption import STOP_GRACE_SECS
from ..runtime.server import CLUSTER_WAIT_SECS
from ..topology.cluster import Cluster, Role, is_loopback, parse_address
from ..topology.taskenv import prepare_this_process, task_environment

log = logging.getLogger("tfcluster")


def warn_if_exposed(cluster: Cluster):
    """One line on who can reach this task: TF's server binds every interface, whatever its address says."""
    import ipaddress
    import re
    address = cluster.address(cluster.task)
    host, port = parse_address(address)
    # A Kubernetes service name, <service>.<namespace>.svc[.cluster.local] (a pod's own is
    # <host>.<subdomain>.<namespace>.svc), as Kubeflow's TFJob names every task (tfcluster/topology/tfconfig.py):
    # the cluster's DNS gives it a pod address, reachable inside the cluster only. After another cluster
    # domain than cluster.local the name could be a public one, so that still warns.
    kubernetes = re.fullmatch(r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?\.){2,3}svc(?:\.cluster\.local)?", host.lower())
    try:
        private = ipaddress.ip_address(host).is_private
    except ValueError:
        private = bool(kubernetes) or host.endswith((".local", ".internal", ".cluster.local")) or "." not in host
    if not (is_loopback(host) or private):
        log.warning("%s at %s is not a loopback or private address: TensorFlow's server has no "
                    "authentication and runs any graph it is sent (see README, Security)", cluster.task, address)
        return
    # (tensorflow/tensorflow#2925: the server listens on 0.0.0.0 even for "localhost:PORT"; pitfalls item 7)
    log.info("note: %s's server listens on port %d of every interface, not only %s, with no authentication: "
             "firewall port %d to the cluster's own hosts%s", cluster.task, port, host, port,
             ", or run a one-machine cluster with tfcluster local, which isolates it" if is_loopback(host) else
             " (on Kubernetes, a NetworkPolicy that admits only this job's pods)" if kubernetes else "")


def needs_tensorflow(cluster: Cluster, command, mode=None):
    """Who in this process needs TensorFlow: the server it hosts, ``mode`` (TF1 or TF2 mode), telling the ps;
    None: nobody."""
    task = cluster.task
    if not command:
        return f"hosting {task}'s server"
    if mode:
        return mode
    if task.trains and cluster.num_tasks("ps"):
        return f"telling the ps tasks when {task} is done"
    return None


def slurm_resources(task):
    """This task's GPUs and threads as SlurmClusterResolver shares them; one line says which."""
    from ..topology.devices import assign_slurm, list_gpus
    gpus, source = list_gpus()
    mine = assign_slurm(os.environ, task.job, gpus)
    log.info("%s gets %s (Slurm: SLURM_LOCALID %s, %s)", task, mine.describe(), os.environ.get("SLURM_LOCALID", "?"),
             f"{len(gpus)} GPU(s) from {source}" if gpus else f"no GPU listed, {source}")
    return mine


def _take_stop_signals(stop: threading.Event, on_stop=None, hold=None):
    """Stop signals set ``stop`` (and call ``on_stop``), unless ``hold(signum)`` takes the signal over."""
    def handler(signum, _frame):
        if hold is not None and hold(signum):
            return
        stop.set()
        stop.signum = signum
        if on_stop:
            on_stop(signum)
    # SIGHUP too, where there is one: closing the terminal of a multi-terminal cluster ends its task cleanly.
    if posix.hangup_signal() is None:
        log.info("platform: no SIGHUP here: closing this terminal does not stop the task cleanly (Ctrl-C does)")
    posix.take_signals(handler)


def host_server(cluster: Cluster, *, timeout: float = CLUSTER_WAIT_SECS, exit_when_done: bool = True,
                stop_grace: float = STOP_GRACE_SECS, verbose: bool = False):
    """Host this task's server until a stop signal, or (a ps, ``exit_when_done``) every trainer is done.

    ``timeout``: seconds a trainer's server waits for its ps tasks. ``stop_grace``: seconds a ps serves
    on after SIGTERM while a trainer answers. The process ends here (``os._exit(0)``) once it served.
    """
    from ..runtime.server import start_server, wait_for_cluster
    from ..runtime.shutdown import Served, drain_on_sigterm, serve_until_done
    task = cluster.task
    prepare_this_process(verbose, keras=False)
    stop, done = threading.Event(), threading.Event()
    done_aware = task.role is Role.PS and exit_when_done
    # Once every trainer is done, the launcher's SIGTERM only cuts the ps's linger short: no drain to announce.
    _take_stop_signals(stop, hold=drain_on_sigterm(cluster, stop, stop_grace, done) if done_aware else None)
    server = start_server(cluster)
    log.info("%s is up at %s; Ctrl-C to stop", task, cluster.address(task))
    warn_if_exposed(cluster)
    if cluster.needed_tasks():
        # A trainer's server is useless without its ps: say so within the timeout, not never.
        try:
            wait_for_cluster(cluster, timeout=timeout, stop=stop)
        except ClusterUnreachableError:
            if not stop.is_set():
                raise
        if stop.is_set():
            log.info("%s stopped (signal)", task)
            return 0
        log.info("%s reaches its ps task(s); hosting until Ctrl-C", task)
    if done_aware:
        log.info("it exits once all %d trainer(s) are done", cluster.num_replicas)
    how = serve_until_done(server, cluster, stop=stop, exit_when_done=done_aware, done=done)
    # Here only a signal handler sets ``stop``: the line reads the same whether it came before or after the ps answered.
    log.info("%s stopped (%s)", task, "signal" if how is Served.STOPPED else how.value)
    # The gRPC server cannot be stopped (Server.stop is unimplemented) and
    # TF's interpreter teardown takes most of a second; a server holds
    # nothing to save, so leave at once.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def run_task_command(cluster: Cluster, command, *, legacy_flags: str = "none", extra_env=None,
                     verbose: bool = False, resources=None) -> int:
    """Run ``command`` as this task (TF_CONFIG set, ``legacy_flags`` appended); its exit code.

    ``resources``: the task's GPUs and threads (:mod:`tfcluster.topology.devices`), set in its environment.
    """
    task = cluster.task
    command = list(command) + cluster.legacy_flags(style=legacy_flags)
    env = task_environment(cluster, verbose)
    env.update(extra_env or {})
    if resources is not None:
        resources.apply(env)
    log.info("%s runs: %s", task, " ".join(shlex.quote(c) for c in command))
    started = []

    def forward(signum):
        for p in started:
            try:
                os.killpg(p.pid, signum)
            except ProcessLookupError:
                pass
    # Handlers go in before the child starts: a signal in between would kill
    # tfcluster and leave the command (in its own session) running, port and all.
    stop = threading.Event()
    _take_stop_signals(stop, forward)
    record = _done_record(cluster, env)
    try:
        try:
            proc = subprocess.Popen(command, env=env, start_new_session=True)
        except OSError as e:
            raise TfclusterError(f"cannot run {command[0]!r}: {e.strerror}") from None
        started.append(proc)
        if stop.is_set():
            forward(stop.signum)
        code = exit_status(proc.wait())
        if code == 0 and record and not stop.is_set():
            _tell_ps_done(cluster, record, verbose)
    finally:
        if record:
            os.unlink(record)
    if code and stop.is_set():
        # A stop it was asked for (a scheduler's SIGTERM, forwarded): the command's own line says what it saved.
        log.info("%s stopped on %s (exit %d)", task, signal.Signals(stop.signum).name, code)
    elif code:
        log.error("%s exited with code %d", task, code)
    return code


def _done_record(cluster: Cluster, env: dict):
    """For a trainer with ps tasks: a private file, named in the command's environment, in which tfcluster's
    library in the command notes each ps it told that this task is done; else None."""
    if not cluster.task.trains or not cluster.num_tasks("ps"):
        return None
    fd, path = tempfile.mkstemp(prefix="tfcluster-done-")
    os.close(fd)
    env[environment.DONE_RECORD.name] = path
    return path


def _tell_ps_done(cluster: Cluster, record: str, verbose: bool):
    """Tell the ps tasks that the command's task is done, unless the command told them itself.

    A ps exits about 2 s after its last trainer's token. A second token from
    here, after fit sent its own, reached a ps that was exiting and waited
    out its deadlines: 18 s and a warning per worker at the end of every job.
    """
    from ..runtime.shutdown import signal_done, told_by_record
    told = told_by_record(record, cluster.task)
    pending = [ps for ps in cluster.tasks(("ps",)) if str(ps) not in told]
    if not pending:
        log.debug("%s's command told every ps that it is done", cluster.task)
        return
    # The command may not use tfcluster's library; tell the ps for it.
    prepare_this_process(verbose, keras=False)
    signal_done(cluster, ps_tasks=pending)
