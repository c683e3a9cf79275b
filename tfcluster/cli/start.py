"""``tfcluster start``: host one task's server, or run a command as that task."""

import os
import sys

from ..core.errors import TfclusterError
from ..core.tfguard import check_tensorflow
from ..launch.task import host_server, needs_tensorflow, run_task_command, slurm_resources, warn_if_exposed
from ..runtime.preemption import STOP_GRACE_SECS
from ..runtime.server import CLUSTER_WAIT_SECS
from ..topology.cluster import Role
from ..topology.taskenv import huge_pages_pending, set_huge_pages
from .common import (add_cluster_args, add_legacy_flags_arg, add_run_args, cluster_from_args, extra_environment,
                     program_mode, task_command)


def add_parser(sub):
    """The ``start`` subcommand and its options."""
    s = sub.add_parser("start", help="host one task's server, or run a command as that task",
                       description="Host one task of a cluster. With no command, start serves the task "
                                   "itself (a ps exits once every trainer is done). With '-- CMD', it runs "
                                   "CMD with TF_CONFIG set for the task; CMD hosts its own server.",
                       usage="tfcluster start [options] --job JOB --task I [[--] COMMAND ...]")
    add_cluster_args(s)
    add_legacy_flags_arg(s, "also pass --job_name/--task_index (and --ps_hosts/--worker_hosts with 'all', the "
                            "default STYLE) to COMMAND")
    s.add_argument("--timeout", type=float, default=CLUSTER_WAIT_SECS, metavar="S",
                   help="with no COMMAND: seconds a worker or chief waits for its ps tasks "
                        f"(default {CLUSTER_WAIT_SECS:g})")
    s.add_argument("--no-exit-when-done", action="store_true",
                   help="a ps keeps serving after every trainer is done, until Ctrl-C")
    s.add_argument("--stop-grace", type=float, default=STOP_GRACE_SECS, metavar="S",
                   help="on SIGTERM (a scheduler stopping the job), a ps serves on while any trainer still "
                        "answers, at most S seconds, so that the chief can write its last checkpoint "
                        f"(default {STOP_GRACE_SECS:g}, Kubernetes' grace; Ctrl-C stops at once)")
    add_run_args(s)
    s.set_defaults(func=run)
    return s


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
    if not command and task.role is Role.PS and huge_pages_pending() and _started_as_the_cli():
        # glibc reads its tunables at start: a ps started by hand, srun or a pod starts again with them (same pid).
        os.execve(sys.executable, sys.orig_argv, set_huge_pages(dict(os.environ)))
    if not command and task.role is Role.EVALUATOR:
        raise TfclusterError("the evaluator has no server to host; give it a command after --")
    check_tensorflow(needs_tensorflow(cluster, command, program_mode(args)))
    resources = slurm_resources(task) if args.slurm else None
    if command:
        if task.role is not Role.EVALUATOR:
            warn_if_exposed(cluster)       # (a hosted server says it once it is up)
        return run_task_command(cluster, command, legacy_flags=args.legacy_flags, extra_env=extra_environment(args),
                                verbose=args.verbose, resources=resources)
    if resources is not None:
        # The server is hosted here: its GPUs and threads are this process's, set before TensorFlow loads.
        resources.apply(os.environ)
    return host_server(cluster, timeout=args.timeout, exit_when_done=not args.no_exit_when_done,
                       stop_grace=args.stop_grace, verbose=args.verbose)
