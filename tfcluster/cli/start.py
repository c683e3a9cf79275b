"""``tfcluster start``: host one task's server, or run a command as that task."""

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
from ..core.tfguard import check_tensorflow
from ..runtime.preemption import STOP_GRACE_SECS
from ..topology.cluster import Cluster, is_loopback, parse_address
from ..topology.taskenv import huge_pages_pending, prepare_this_process, set_huge_pages, task_environment
from .common import add_cluster_args, add_run_args, cluster_from_args, extra_environment, task_command

log = logging.getLogger("tfcluster")


def add_parser(sub):
    """The ``start`` subcommand and its options."""
    s = sub.add_parser("start", help="host one task's server, or run a command as that task",
                       description="Host one task of a cluster. With no command, start serves the task "
                                   "itself (a ps exits once every trainer is done). With '-- CMD', it runs "
                                   "CMD with TF_CONFIG set for the task; CMD hosts its own server.",
                       usage="tfcluster start [options] --job JOB --task I [[--] COMMAND ...]")
    add_cluster_args(s)
    s.add_argument("--legacy-flags", nargs="?", const="all", default="none", choices=("all", "job-task", "none"),
                   help="also pass --job_name/--task_index (and --ps_hosts/--worker_hosts with 'all') to COMMAND")
    s.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="with no COMMAND: seconds a worker or chief waits for its ps tasks (default 120)")
    s.add_argument("--no-exit-when-done", action="store_true",
                   help="a ps keeps serving after every trainer is done, until Ctrl-C")
    s.add_argument("--stop-grace", type=float, default=STOP_GRACE_SECS, metavar="S",
                   help="on SIGTERM (a scheduler stopping the job), a ps serves on while any trainer still "
                        "answers, at most S seconds, so that the chief can write its last checkpoint "
                        f"(default {STOP_GRACE_SECS:g}, Kubernetes' grace; Ctrl-C stops at once)")
    add_run_args(s)
    s.set_defaults(func=run)
    return s


def _warn_if_exposed(cluster: Cluster):
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


def _install_stop_handlers(stop: threading.Event, on_stop=None, hold=None):
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
    for s in posix.stop_signals():
        signal.signal(s, handler)


def _needs_tensorflow(cluster: Cluster, command, tf1: bool):
    """Who in this process needs TensorFlow: the server it hosts, TF1 mode, telling the ps; None: nobody."""
    task = cluster.task
    if not command:
        return f"hosting {task}'s server"
    if tf1:
        return "TF1 mode"
    if cluster.role(task) in ("worker", "chief") and cluster.num_tasks("ps"):
        return f"telling the ps tasks when {task} is done"
    return None


def _slurm_resources(args, task):
    """Under --slurm, this task's GPUs and threads as SlurmClusterResolver shares them (one line says
    which); else None."""
    if not args.slurm:
        return None
    from ..topology.devices import assign_slurm, list_gpus
    gpus, source = list_gpus()
    mine = assign_slurm(os.environ, task.job, gpus)
    log.info("%s gets %s (Slurm: SLURM_LOCALID %s, %s)", task, mine.describe(), os.environ.get("SLURM_LOCALID", "?"),
             f"{len(gpus)} GPU(s) from {source}" if gpus else f"no GPU listed, {source}")
    return mine


def _started_as_the_cli(argv0=None) -> bool:
    """True when this process is the tfcluster command itself (``tfcluster`` or ``python -m tfcluster``), so
    starting it again runs only the CLI: a program that calls the CLI's main in-process would run again whole."""
    argv0 = os.path.abspath(sys.argv[0] if argv0 is None else argv0)
    package_main = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__main__.py")
    return os.path.basename(argv0) == "tfcluster" or argv0 == package_main


def run(args) -> int:
    """Host a task's server, or run a command as that task with TF_CONFIG set."""
    cluster = cluster_from_args(args)
    task = cluster.task
    command = task_command(args)
    if not command and task.job == "ps" and huge_pages_pending() and _started_as_the_cli():
        # glibc reads its tunables at start: a ps started by hand, srun or a pod starts again with them (same pid).
        os.execve(sys.executable, sys.orig_argv, set_huge_pages(dict(os.environ)))
    if not command and task.job == "evaluator":
        raise TfclusterError("the evaluator has no server to host; give it a command after --")
    check_tensorflow(_needs_tensorflow(cluster, command, args.tf1))
    resources = _slurm_resources(args, task)
    if command:
        if task.job != "evaluator":
            _warn_if_exposed(cluster)       # (a hosted server says it once it is up)
        return _run_task_command(cluster, command, args, resources)
    if resources is not None:
        # The server is hosted here: its GPUs and threads are this process's, set before TensorFlow loads.
        resources.apply(os.environ)
    return _host_server(cluster, args)


def _host_server(cluster: Cluster, args) -> int:
    from ..runtime.server import start_server, wait_for_cluster
    from ..runtime.shutdown import Served, drain_on_sigterm, serve_until_done
    task = cluster.task
    prepare_this_process(args.verbose, hosted_server=True)
    stop, done = threading.Event(), threading.Event()
    done_aware = task.job == "ps" and not args.no_exit_when_done
    # Once every trainer is done, the launcher's SIGTERM only cuts the ps's linger short: no drain to announce.
    _install_stop_handlers(stop, hold=drain_on_sigterm(cluster, stop, args.stop_grace, done) if done_aware else None)
    server = start_server(cluster)
    log.info("%s is up at %s; Ctrl-C to stop", task, cluster.address(task))
    _warn_if_exposed(cluster)
    if cluster.needed_tasks():
        # A trainer's server is useless without its ps: say so within the timeout, not never.
        try:
            wait_for_cluster(cluster, timeout=args.timeout, stop=stop)
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


def _run_task_command(cluster: Cluster, command, args, resources) -> int:
    task = cluster.task
    command = command + cluster.legacy_flags(style=args.legacy_flags)
    env = task_environment(cluster, args.verbose)
    env.update(extra_environment(args))
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
    _install_stop_handlers(stop, forward)
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
            _tell_ps_done(cluster, record, args)
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
    if cluster.role() not in ("worker", "chief") or not cluster.num_tasks("ps"):
        return None
    fd, path = tempfile.mkstemp(prefix="tfcluster-done-")
    os.close(fd)
    env[environment.DONE_RECORD.name] = path
    return path


def _tell_ps_done(cluster: Cluster, record: str, args):
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
    prepare_this_process(args.verbose)
    signal_done(cluster, ps_tasks=pending)
