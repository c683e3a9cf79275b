"""``tfcluster local``: a whole cluster on this machine from one command, supervised (:mod:`tfcluster.launch`)."""

import argparse
import sys

from ..core import environment
from ..core.errors import TfclusterError
from ..core.logs import use_prefixed_logging
from ..core.tfguard import check_tensorflow, require_tensorflow
from ..launch.config import EVALUATOR_GRACE_SECS
from ..runtime.preemption import STOP_GRACE_SECS
from ..topology.cluster import Cluster, LegacyFlags
from .common import add_legacy_flags_arg, add_run_args, extra_environment, program_mode, task_command, task_count

DESCRIPTION = """\
Start one process per task on this machine, show every line of every task prefixed
with its name ([worker:1] ...), keep one log file per task, and stop the cluster once
the trainers (workers and chief) have exited.

Who runs what:
  worker, chief, evaluator  COMMAND, with TF_CONFIG set for the task (the evaluator is
                            not in the cluster; its TF_CONFIG task is evaluator:0)
  ps                        hosted by tfcluster itself ('tfcluster start' as that ps);
                            with --legacy-flags the ps runs COMMAND too, as TF1 scripts
                            expect (one script, role by --job_name), and the launcher
                            ends it, server.join() and all, when the trainers are done
Every task's port is held by the launcher until its server answers, so nothing
takes it in between (children get TF_GRPC_REUSE_PORT=1).

The command goes after '--', or without it when it is a script or python:
  tfcluster local --workers 2 train.py --epochs 3      (runs this Python on train.py)
  tfcluster local --workers 2 python -u train.py --epochs 3

--ps N and --chief make tasks here: N parameter servers, and a chief. In 'start'
and 'status', which join or inspect a cluster that exists, --ps H:P,... and
--chief H:P give the tasks' addresses instead.

Devices: each worker and the chief get GPUs of their own (CUDA_VISIBLE_DEVICES):
--gpus-per-worker N each, by default the GPUs listed (the CUDA_VISIBLE_DEVICES
the launcher has, else nvidia-smi -L) split evenly; a ps gets none. Thread pools
(TF_NUM_INTRAOP_THREADS, TF_NUM_INTEROP_THREADS, OMP_NUM_THREADS) share the
cores: each ps gets 1, the trainers split the rest; --threads-per-task N gives
every task N, 0 leaves TensorFlow's defaults. One line says who got what.

Memory: --ps-memory SIZE (1500M, 1.5G) runs each ps in a memory cgroup of its own,
made below the launcher's (cgroup v1 or v2, whichever has the memory controller;
it needs root). A ps the kernel kills for memory is named in one line with its
limit, its peak and the state each ps held; the run ends with 137 (docs/memory.md).

Every option can also come from an environment variable {prefix}<OPTION>, for
wrapper scripts under Slurm or Kubernetes: {workers}=2,
{max_restarts}=1, {no_isolate}=1 (switches take 1 or 0). The
command line wins.

Isolation: TensorFlow's servers listen on every interface with no authentication.
Where the system allows it (root, or unprivileged user namespaces), the whole cluster
runs in its own network namespace with only loopback: no other host can reach it,
and its tasks cannot reach the network either. One line says which it is;
--no-isolate turns it off (a task that downloads data, or a tfcluster status from
another shell, needs that). A non-loopback --host or cluster turns it off too, as
does a system that refuses network namespaces; --require-isolation makes either a
one-line error before any task starts.
The launcher's verdict on a failed run goes to stderr; everything else to stdout,
ending with one line on how the run ended (its restarts; on a failure, the task,
the exit code and the log dir).""".format(
    prefix=environment.OPTION_PREFIX, workers=environment.option_variable("--workers"),
    max_restarts=environment.option_variable("--max-restarts"),
    no_isolate=environment.option_variable("--no-isolate"))

EPILOG = """\
exit codes:
  0        every trainer succeeded
  N        the first trainer that failed for good exited with N (128+S: killed by
           signal S); one line names it and its log file. A ps that dies and cannot
           be restarted ends the run the same way.
  2        bad usage; nothing was started
  124      --timeout expired; everything was stopped
  130/143  the launcher got Ctrl-C/SIGTERM; everything was stopped

example:
  tfcluster local --ps 1 --workers 2 -- python train.py --steps 100"""

USAGE = """\
tfcluster local [--ps N] [--workers M] [--chief] [--evaluator] [--legacy-flags[=STYLE]]
                       [--log-dir DIR] [--timeout S] [--max-restarts K] [--evaluator-grace S]
                       [--host H] [--cluster FILE | --ports P,...] [--join-grace S] [--stop-grace S] [--tf1 [--no-fork] | --tf2]
                       [--strategy NAME] [--wire TYPE] [--math TYPE] [--gpus-per-worker N] [--threads-per-task N]
                       [--ps-memory SIZE] [--timestamps] [--run-id ID] [--no-isolate | --require-isolation]
                       [--verbose]
                       [--] COMMAND [ARGS ...]"""


def add_parser(sub):
    """The ``local`` subcommand and its options."""
    lo = sub.add_parser("local", help="run a whole cluster on this machine from one command, supervised",
                        formatter_class=argparse.RawDescriptionHelpFormatter, usage=USAGE,
                        description=DESCRIPTION, epilog=EPILOG)
    lo.add_argument("--ps", type=task_count, metavar="N", help="how many parameter servers (default 1)")
    lo.add_argument("--workers", type=task_count, metavar="M", help="how many workers (default 2)")
    lo.add_argument("--chief", action="store_true", help="add a chief task (it runs COMMAND)")
    lo.add_argument("--evaluator", action="store_true",
                    help="add an evaluator (runs COMMAND outside the cluster; stopped after --evaluator-grace)")
    add_legacy_flags_arg(lo, "pass --job_name/--task_index (and --ps_hosts/--worker_hosts with 'all', the "
                             "default STYLE) to COMMAND, and run COMMAND as the ps too; 'none' to turn off")
    lo.add_argument("--log-dir", metavar="DIR",
                    help="one log file per task here (default: a new ./tfcluster-logs/<time> directory)")
    lo.add_argument("--timeout", type=float, metavar="S", help="stop everything after S seconds (exit 124)")
    lo.add_argument("--max-restarts", type=int, default=0, metavar="K",
                    help="restart a trainer or ps that crashes (non-zero exit or signal) up to K times, "
                         "with the same TF_CONFIG and port (default 0); with no ps (an all-reduce group, "
                         "which takes no new member) or under --tf2, every trainer restarts together")
    lo.add_argument("--evaluator-grace", type=float, default=EVALUATOR_GRACE_SECS, metavar="S",
                    help="seconds the evaluator may run on after the trainers are done "
                         f"(default {EVALUATOR_GRACE_SECS:g})")
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
    lo.add_argument("--stop-grace", type=float, default=STOP_GRACE_SECS, metavar="S",
                    help="on Ctrl-C, SIGTERM or a failed task, each task has S seconds after SIGTERM before "
                         f"SIGKILL: a trainer ends its step and writes its checkpoint (default {STOP_GRACE_SECS:g}; a second "
                         "signal stops everything at once)")
    lo.add_argument("--no-isolate", action="store_true",
                    help="do not run the cluster in its own loopback-only network namespace (its ports are then "
                         "reachable from other hosts, and it can reach the network)")
    lo.add_argument("--require-isolation", action="store_true",
                    help="stop, before any task starts, when the cluster cannot run isolated (a non-loopback "
                         "address, or a system without network namespaces) instead of running it exposed")
    lo.add_argument("--gpus-per-worker", type=int, metavar="N",
                    help="GPUs of each worker and the chief (default: the listed GPUs split evenly; 0: none)")
    lo.add_argument("--threads-per-task", type=int, metavar="N",
                    help="thread pools of every task (default: the cores split among the trainers, 1 per ps; "
                         "0: TensorFlow's defaults)")
    lo.add_argument("--ps-memory", metavar="SIZE",
                    help="memory limit of each ps task, e.g. 1500M or 1.5G (powers of 1024): each ps runs in a "
                         "memory cgroup of its own (needs root); one killed for memory is named as such")
    lo.add_argument("--no-fork", action="store_true",
                    help="with --tf1, start each task as a Python process of its own that imports TensorFlow "
                         "itself (by default the TF1-mode tasks are forked from one process that imported it "
                         "once: each starts its script within a second instead of ~8 s of CPU)")
    lo.add_argument("--timestamps", action="store_true", help="start every line shown with the time it arrived")
    lo.add_argument("--run-id", metavar="ID",
                    help=f"this run's id, in every task's {environment.RUN_ID} (default: Slurm's job id, else a "
                         "new one, printed at the start); a Keras fit's default checkpoint dir is "
                         "tfcluster-keras/<run id>/<model>, so the id of a stopped run resumes it")
    add_run_args(lo)
    lo.set_defaults(func=run)
    lo.reads_environment = True     # TFCLUSTER_<OPTION> variables are its defaults (cli.main)
    return lo


def launch_config(args):
    """The LaunchConfig these options ask for (validated: one clear error before anything starts)."""
    from ..launch import LaunchConfig
    command = task_command(args)
    if not command:
        raise TfclusterError("no command to run; give it after '--', e.g. tfcluster local -- python train.py "
                             "(a script or python needs no '--')")
    return LaunchConfig(
        command, ps=1 if args.ps is None else args.ps, workers=2 if args.workers is None else args.workers,
        chief=args.chief, evaluator=args.evaluator, legacy_flags=args.legacy_flags, log_dir=args.log_dir,
        timeout=args.timeout, max_restarts=args.max_restarts, evaluator_grace=args.evaluator_grace,
        verbose=args.verbose, host=args.host, cluster=_explicit_cluster(args), join_grace=args.join_grace,
        stop_grace=args.stop_grace,
        isolate=not args.no_isolate, require_isolation=args.require_isolation, subreaper=True, env=extra_environment(args),
        gpus_per_worker=args.gpus_per_worker, threads_per_task=args.threads_per_task, timestamps=args.timestamps,
        run_id=args.run_id, ps_memory=args.ps_memory, fork_tf1=not args.no_fork)


def _explicit_cluster(args):
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


def _needs_tensorflow(config, mode):
    """Who in this launcher's own Python needs TensorFlow: the ps tasks it hosts, TF1 or TF2 mode; None: nobody."""
    if mode:
        return mode
    if config.ps and config.legacy_flags is LegacyFlags.NONE:
        return "hosting the ps tasks"
    return None


def run(args) -> int:
    """Run a whole cluster on this machine from one command, supervised."""
    from ..launch import LineWriter, LocalLauncher
    config = launch_config(args)
    needed_for = _needs_tensorflow(config, program_mode(args))
    if needed_for:
        require_tensorflow(needed_for)
    writer = LineWriter(sys.stdout, timestamps=config.timestamps)
    # Only now, with the input valid: the launcher's lines join its tasks' lines on stdout.
    use_prefixed_logging(writer, debug=args.verbose, error_writer=LineWriter(sys.stderr, config.timestamps))
    check_tensorflow()
    return LocalLauncher(config, writer=writer).run()
