"""``tfcluster``: the command line. It parses, calls the library, and prints.

Exit codes: 0 success; 1 a task reported down (``status``); 2 bad usage or
input; 3 timed out waiting for the cluster; otherwise the code of the command
that ``start`` ran (128+N when it died of signal N).
"""

import argparse
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading

from . import __version__
from .cluster import Cluster, TASK_TYPES, is_loopback, parse_address
from .errors import TfclusterError
from .launch import task_environment

log = logging.getLogger("tfcluster")

EXIT_DOWN = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: ``tfcluster: error: ...``."""

    def error(self, message):
        sys.stderr.write(f"tfcluster: error: {message} (see '{self.prog} --help')\n")
        sys.exit(EXIT_USAGE)


# ------------------------------------------------------------- cluster args
def add_cluster_args(p, task=True):
    """Options that say where the cluster's tasks live, shared by several commands."""
    g = p.add_argument_group("cluster (one source; default: the TF_CONFIG environment variable)")
    g.add_argument("--cluster", metavar="FILE",
                   help="JSON file: {\"worker\": [...], \"ps\": [...]} or the TF_CONFIG shape")
    g.add_argument("--ps", dest="ps_hosts", metavar="H:P,...", help="ps addresses, comma-separated")
    g.add_argument("--worker", dest="worker_hosts", metavar="H:P,...", help="worker addresses, comma-separated")
    g.add_argument("--chief", dest="chief_hosts", metavar="H:P", help="the chief's address")
    g.add_argument("--ps_hosts", dest="ps_hosts", help=argparse.SUPPRESS)
    g.add_argument("--worker_hosts", dest="worker_hosts", help=argparse.SUPPRESS)
    g.add_argument("--slurm", action="store_true",
                   help="read Slurm's environment (SLURM_PROCID, SLURM_STEP_NODELIST, ...)")
    g.add_argument("--slurm-ps", type=int, default=0, metavar="N",
                   help="with --slurm: the first N tasks are ps (default 0)")
    g.add_argument("--slurm-port-base", type=int, default=8888, metavar="P",
                   help="with --slurm: first port on each node (default 8888)")
    if task:
        t = p.add_argument_group("this task")
        t.add_argument("--job", "--job_name", dest="job", choices=TASK_TYPES, help="this task's job")
        t.add_argument("--task", "--task_index", dest="task", type=int, metavar="I", help="this task's index")


def cluster_from_args(args, need_task=True) -> Cluster:
    """Resolve the cluster (and this task) from parsed args, in one clear order."""
    hosts = [args.ps_hosts, args.worker_hosts, args.chief_hosts]
    sources = [n for n, used in (("--cluster", args.cluster), ("host lists", any(h is not None for h in hosts)),
                                 ("--slurm", args.slurm)) if used]
    if len(sources) > 1:
        raise TfclusterError(f"give one cluster source, not {' and '.join(sources)}")
    job, index = getattr(args, "job", None), getattr(args, "task", None)
    if args.cluster:
        cluster = Cluster.from_file(args.cluster)
    elif sources == ["host lists"]:
        cluster = Cluster.from_hosts(ps=args.ps_hosts, worker=args.worker_hosts, chief=args.chief_hosts)
    elif args.slurm:
        cluster = Cluster.from_slurm(ps=args.slurm_ps, port_base=args.slurm_port_base)
    elif os.environ.get("TF_CONFIG"):
        cluster = Cluster.from_tf_config()
    else:
        raise TfclusterError("no cluster given: use --cluster FILE, --ps/--worker host lists, --slurm or TF_CONFIG")
    if (job is None) != (index is None):
        raise TfclusterError("--job and --task go together; give both or neither")
    if job is not None:
        cluster = cluster.with_task(job, index)
    if need_task and cluster.task is None:
        raise TfclusterError("which task is this? give --job and --task (or a TF_CONFIG with a 'task')")
    return cluster


# -------------------------------------------------------------------- start
def _warn_if_exposed(cluster: Cluster):
    host, _ = parse_address(cluster.address(cluster.task))
    try:
        import ipaddress
        private = ipaddress.ip_address(host).is_private
    except ValueError:
        private = host.endswith((".local", ".internal", ".cluster.local")) or "." not in host
    if not (is_loopback(host) or private):
        log.warning("%s at %s is not a loopback or private address: TensorFlow's server has no "
                    "authentication and runs any graph it is sent (see README, Security)",
                    cluster.task, cluster.address(cluster.task))


def _install_stop_handlers(stop: threading.Event, on_stop=None):
    def handler(signum, _frame):
        stop.set()
        stop.signum = signum
        if on_stop:
            on_stop(signum)
    # SIGHUP too: closing the terminal of a multi-terminal cluster ends its task cleanly.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, handler)


def cmd_start(args) -> int:
    """Host a task's server, or run a command as that task with TF_CONFIG set."""
    cluster = cluster_from_args(args)
    task = cluster.task
    command = _tf1_command(args)
    if task.job != "evaluator":
        _warn_if_exposed(cluster)
    if command:
        return _run_task_command(cluster, command, args)
    if task.job == "evaluator":
        raise TfclusterError("the evaluator has no server to host; give it a command after --")
    from .errors import ClusterUnreachableError
    from .server import serve_until_done, start_server, quiet_tensorflow, wait_for_cluster
    quiet_tensorflow(args.verbose)
    # A hosted server runs no Keras. TF imports Keras 3 eagerly, and Keras 3
    # its scikit-learn wrapper (and SciPy) when they are installed: 1 s of the
    # 3.5 s import here, on cores the trainers are importing TF on. With this
    # variable TF tries tf-keras instead, and carries on when it is absent.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    stop = threading.Event()
    _install_stop_handlers(stop)
    server = start_server(cluster)
    log.info("%s is up at %s; Ctrl-C to stop", task, cluster.address(task))
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
    done_aware = task.job == "ps" and not args.no_exit_when_done
    if done_aware:
        log.info("it exits once all %d trainer(s) are done", cluster.num_replicas)
    how = serve_until_done(server, cluster, stop=stop, exit_when_done=done_aware)
    log.info("%s stopped (%s)", task, "all trainers done" if how == "done" else "signal")
    # The gRPC server cannot be stopped (Server.stop is unimplemented) and
    # TF's interpreter teardown takes most of a second; a server holds
    # nothing to save, so leave at once.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def _run_task_command(cluster: Cluster, command, args) -> int:
    task = cluster.task
    command = command + cluster.legacy_flags(style=args.legacy_flags)
    env = task_environment(cluster, args.verbose)
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
    try:
        proc = subprocess.Popen(command, env=env, start_new_session=True)
    except OSError as e:
        raise TfclusterError(f"cannot run {command[0]!r}: {e.strerror}") from None
    started.append(proc)
    if stop.is_set():
        forward(stop.signum)
    code = proc.wait()
    if code < 0:
        code = 128 - code
    if code == 0 and task.job in ("worker", "chief") and cluster.num_tasks("ps") and not stop.is_set():
        # The command may not use tfcluster's library; tell the ps for it.
        from .server import signal_done, quiet_tensorflow
        quiet_tensorflow(args.verbose)
        signal_done(cluster)
    if code:
        log.error("%s exited with code %d", task, code)
    return code


def _tf1_command(args) -> list:
    """The command to run: with --tf1, ``python script.py`` becomes ``python -m tfcluster.tf1 script.py``."""
    command = list(args.command)
    if getattr(args, "tf1", False):
        if not command:
            raise TfclusterError("--tf1 runs a TF 1.x script: give it after '--', e.g. -- python train.py")
        from .tf1 import tf1_command
        command = tf1_command(command)
    return command


# -------------------------------------------------------------------- local
def cmd_local(args) -> int:
    """Run a whole cluster on this machine from one command, supervised (see tfcluster.launch)."""
    from .launch import LineWriter, LocalLauncher, use_prefixed_logging
    writer = LineWriter(sys.stdout)
    explicit = _explicit_local_cluster(args)
    ps = 1 if args.ps is None else args.ps
    workers = 2 if args.workers is None else args.workers
    launcher = LocalLauncher(_tf1_command(args), ps=ps, workers=workers, chief=args.chief,
                             evaluator=args.evaluator, legacy_flags=args.legacy_flags, log_dir=args.log_dir,
                             timeout=args.timeout, max_restarts=args.max_restarts,
                             evaluator_grace=args.evaluator_grace, verbose=args.verbose, host=args.host,
                             writer=writer, subreaper=True, cluster=explicit, join_grace=args.join_grace,
                             isolate=not args.no_isolate)
    # Only now, with the input valid: the launcher's lines join its tasks' lines on stdout.
    use_prefixed_logging(writer, debug=args.verbose or bool(os.environ.get("TFCLUSTER_DEBUG")),
                         error_writer=LineWriter(sys.stderr))
    return launcher.run()


def _explicit_local_cluster(args):
    """The cluster of --cluster FILE or --ports LIST (scripts with hard-coded ports), else None."""
    if args.cluster and args.ports:
        raise TfclusterError("give --cluster FILE or --ports LIST, not both")
    if args.cluster:
        given = [o for o, v in (("--ps", args.ps), ("--workers", args.workers), ("--chief", args.chief or None))
                 if v is not None]
        if given:
            raise TfclusterError(f"--cluster {args.cluster} already says how many tasks there are; drop "
                                 + " and ".join(given))
        cluster = Cluster.from_file(args.cluster)
        return Cluster(cluster.jobs)
    if args.ports:
        try:
            ports = [int(p) for p in args.ports.split(",") if p.strip()]
        except ValueError:
            raise TfclusterError(f"--ports: {args.ports!r} is not a comma-separated list of port numbers") from None
        return Cluster.local(ps=1 if args.ps is None else args.ps,
                             workers=2 if args.workers is None else args.workers,
                             chief=args.chief, host=args.host, ports=ports)
    return None


# --------------------------------------------------------------------- spec
def cmd_spec(args) -> int:
    """Write a local cluster spec and print the command for each terminal."""
    cluster = Cluster.local(ps=args.ps, workers=args.workers, chief=args.chief, host=args.host,
                            base_port=args.base_port)
    text = cluster.to_json()
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise TfclusterError(f"cannot write {args.output}: {e.strerror}") from None
        spec_arg = shlex.quote(args.output)
    else:
        sys.stdout.write(text)
        spec_arg = "cluster.json"
        print("# save the JSON above as cluster.json, then run:")
    script = " ".join(shlex.quote(c) for c in args.command) or "python train.py"
    print(f"# {len(cluster.tasks())} task(s); one terminal each:")
    # The ps first: the workers wait for it, as in the two-terminal tutorial.
    for t in cluster.tasks(("ps",)) + cluster.tasks(("chief", "worker")):
        tail = "" if t.job == "ps" else f" -- {script}"
        print(f"tfcluster start --cluster {spec_arg} --job {t.job} --task {t.index}{tail}")
    print(f"# check them: tfcluster status --cluster {spec_arg}")
    return 0


# ------------------------------------------------------------------- status
def cmd_status(args) -> int:
    """Print one row per task (job, index, address, up/down); exit 1 if any is down."""
    cluster = cluster_from_args(args, need_task=False)
    from .server import probe
    states = probe(cluster, timeout=args.timeout)
    print(f"{'JOB':<8} {'INDEX':>5}  {'ADDRESS':<28} STATE")
    for t, state in states.items():
        print(f"{t.job:<8} {t.index:>5}  {cluster.address(t):<28} {state}")
    down = [t for t, s in states.items() if s != "up"]
    if down:
        print(f"tfcluster: {len(down)} of {len(states)} task(s) down: "
              + ", ".join(str(t) for t in down), file=sys.stderr)
        return EXIT_DOWN
    return 0


# --------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The ``tfcluster`` argument parser with all its subcommands."""
    p = _Parser(prog="tfcluster", description="Run graph-mode TensorFlow 1 code on clusters.",
                epilog="Run 'tfcluster COMMAND --help' for a command's options.")
    p.add_argument("--version", action="version", version=f"tfcluster {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("start", help="host one task's server, or run a command as that task",
                       description="Host one task of a cluster. With no command, start serves the task "
                                   "itself (a ps exits once every trainer is done). With '-- CMD', it runs "
                                   "CMD with TF_CONFIG set for the task; CMD hosts its own server.",
                       usage="tfcluster start [options] --job JOB --task I [-- COMMAND ...]")
    add_cluster_args(s)
    s.add_argument("--legacy-flags", nargs="?", const="all", default="none", choices=("all", "job-task", "none"),
                   help="also pass --job_name/--task_index (and --ps_hosts/--worker_hosts with 'all') to COMMAND")
    s.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="with no COMMAND: seconds a worker or chief waits for its ps tasks (default 120)")
    s.add_argument("--tf1", action="store_true",
                   help="run 'python script.py' in TF1 mode: 'import tensorflow as tf' gives tf.compat.v1, "
                        "tf.contrib and tensorflow.examples...mnist work (docs/tf1.md)")
    s.add_argument("--no-exit-when-done", action="store_true",
                   help="a ps keeps serving after every trainer is done, until Ctrl-C")
    s.add_argument("--verbose", action="store_true", help="show TensorFlow's C++ logs")
    s.set_defaults(func=cmd_start)

    sp = sub.add_parser("spec", help="write a cluster spec for one machine and print each terminal's command",
                        description="Write a cluster spec on one host and print the command for each "
                                    "terminal, for a cluster started by hand.",
                        usage="tfcluster spec [--ps N] [--workers M] [--chief] [--host H] [--base-port P] "
                              "[-o FILE] [-- COMMAND ...]")
    sp.add_argument("--ps", type=int, default=1, metavar="N", help="parameter servers (default 1)")
    sp.add_argument("--workers", type=int, default=2, metavar="M", help="workers (default 2)")
    sp.add_argument("--chief", action="store_true", help="add a chief task")
    sp.add_argument("--host", default="localhost", help="host of every task (default localhost)")
    sp.add_argument("--base-port", type=int, metavar="P", help="consecutive ports from P (default: free ports)")
    sp.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: print it)")
    sp.set_defaults(func=cmd_spec)

    lo = sub.add_parser(
        "local", help="run a whole cluster on this machine from one command, supervised",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="tfcluster local [--ps N] [--workers M] [--chief] [--evaluator] [--legacy-flags[=STYLE]]\n"
              "                       [--log-dir DIR] [--timeout S] [--max-restarts K] [--evaluator-grace S]\n"
              "                       [--host H] [--cluster FILE | --ports P,...] [--join-grace S] [--tf1]\n"
              "                       [--no-isolate] [--verbose] -- COMMAND [ARGS ...]",
        description="Start one process per task on this machine, show every line of every task prefixed\n"
                    "with its name ([worker:1] ...), keep one log file per task, and stop the cluster once\n"
                    "the trainers (workers and chief) have exited.\n\n"
                    "Who runs what:\n"
                    "  worker, chief, evaluator  COMMAND, with TF_CONFIG set for the task (the evaluator is\n"
                    "                            not in the cluster; its TF_CONFIG task is evaluator:0)\n"
                    "  ps                        hosted by tfcluster itself ('tfcluster start' as that ps);\n"
                    "                            with --legacy-flags the ps runs COMMAND too, as TF1 scripts\n"
                    "                            expect (one script, role by --job_name), and the launcher\n"
                    "                            ends it, server.join() and all, when the trainers are done\n"
                    "Every task's port is held by the launcher until its server answers, so nothing\n"
                    "takes it in between (children get TF_GRPC_REUSE_PORT=1).\n\n"
                    "Isolation: TensorFlow's servers listen on every interface with no authentication.\n"
                    "Where the system allows it (root, or unprivileged user namespaces), the whole cluster\n"
                    "runs in its own network namespace with only loopback: no other host can reach it,\n"
                    "and its tasks cannot reach the network either. One line says which it is;\n"
                    "--no-isolate turns it off (a task that downloads data, or a tfcluster status from\n"
                    "another shell, needs that). A non-loopback --host or cluster turns it off too.\n"
                    "The launcher's verdict on a failed run goes to stderr; everything else to stdout.",
        epilog="exit codes:\n"
               "  0        every trainer succeeded\n"
               "  N        the first trainer that failed for good exited with N (128+S: killed by\n"
               "           signal S); one line names it and its log file. A ps that dies and cannot\n"
               "           be restarted ends the run the same way.\n"
               "  2        bad usage; nothing was started\n"
               "  124      --timeout expired; everything was stopped\n"
               "  130/143  the launcher got Ctrl-C/SIGTERM; everything was stopped\n\n"
               "example:\n"
               "  tfcluster local --ps 1 --workers 2 -- python train.py --steps 100")
    lo.add_argument("--ps", type=int, metavar="N", help="parameter servers (default 1)")
    lo.add_argument("--workers", type=int, metavar="M", help="workers (default 2)")
    lo.add_argument("--chief", action="store_true", help="add a chief task (it runs COMMAND)")
    lo.add_argument("--evaluator", action="store_true",
                    help="add an evaluator (runs COMMAND outside the cluster; stopped after --evaluator-grace)")
    lo.add_argument("--legacy-flags", nargs="?", const="all", default="none", choices=("all", "job-task", "none"),
                    metavar="STYLE",
                    help="pass --job_name/--task_index (and --ps_hosts/--worker_hosts with 'all', the "
                         "default STYLE) to COMMAND, and run COMMAND as the ps too; 'none' to turn off")
    lo.add_argument("--log-dir", metavar="DIR",
                    help="one log file per task here (default: a new ./tfcluster-logs/<time> directory)")
    lo.add_argument("--timeout", type=float, metavar="S", help="stop everything after S seconds (exit 124)")
    lo.add_argument("--max-restarts", type=int, default=0, metavar="K",
                    help="restart a trainer or ps that crashes (non-zero exit or signal) up to K times, "
                         "with the same TF_CONFIG and port (default 0)")
    lo.add_argument("--evaluator-grace", type=float, default=60.0, metavar="S",
                    help="seconds the evaluator may run on after the trainers are done (default 60)")
    lo.add_argument("--host", default="localhost", metavar="H", help="address of every task (default localhost)")
    lo.add_argument("--cluster", metavar="FILE",
                    help="use this cluster (JSON, as for 'start') instead of free ports: for scripts with "
                         "hard-coded ports; every task must be on this machine")
    lo.add_argument("--ports", metavar="P,P,...",
                    help="use these ports instead of free ones, one per task in this order: the chief, "
                         "the workers, then the ps tasks (e.g. --ps 1 --workers 2 --ports 2223,2224,2222 "
                         "puts worker:0 on 2223, worker:1 on 2224 and ps:0 on 2222)")
    lo.add_argument("--join-grace", type=float, metavar="S",
                    help="S seconds after the chief (or worker 0) finished, stop trainers still running as "
                         "left in server.join() (default: wait for every trainer)")
    lo.add_argument("--tf1", action="store_true",
                    help="run 'python script.py' in TF1 mode: 'import tensorflow as tf' gives tf.compat.v1, "
                         "tf.contrib and tensorflow.examples...mnist work (docs/tf1.md)")
    lo.add_argument("--no-isolate", action="store_true",
                    help="do not run the cluster in its own loopback-only network namespace (its ports are then "
                         "reachable from other hosts, and it can reach the network)")
    lo.add_argument("--verbose", action="store_true",
                    help="show TensorFlow's C++ logs and the launcher's debug lines")
    lo.set_defaults(func=cmd_local)

    st = sub.add_parser("status", help="show which tasks of a cluster are up",
                        description="Probe every task over gRPC and print job, index, address and up/down. "
                                    "Exits 1 when any task is down.")
    add_cluster_args(st, task=False)
    st.add_argument("--timeout", type=float, default=2.0, metavar="S",
                    help="seconds to wait for each task to answer (default 2)")
    st.set_defaults(func=cmd_status)
    return p


def _split_command(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def setup_logging():
    """Log lines as ``HH:MM:SS tfcluster: message`` on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s tfcluster: %(levelname_)s%(message)s", "%H:%M:%S"))

    class _Level(logging.Filter):
        def filter(self, record):
            record.levelname_ = "" if record.levelno <= logging.INFO else record.levelname.lower() + ": "
            return True
    handler.addFilter(_Level())
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if os.environ.get("TFCLUSTER_DEBUG") else logging.INFO)
    log.propagate = False


def main(argv=None) -> int:
    """Entry point of the ``tfcluster`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, command = _split_command(argv)
    parser = build_parser()
    args = parser.parse_args(own)
    if args.cmd is None:
        parser.print_help()
        return EXIT_USAGE
    args.command = command
    if command and args.cmd == "status":
        parser.error("status takes no command after --")
    setup_logging()
    try:
        return args.func(args)
    except TfclusterError as e:
        print(f"tfcluster: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
