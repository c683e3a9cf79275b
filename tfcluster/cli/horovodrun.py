"""``tfcluster horovodrun``: Horovod's launcher line, run as the ``tfcluster local`` it means.

``horovodrun -np N python train.py`` started N copies of a Horovod program on
this machine; here that is ``tfcluster local --tf1 --ps 0 --workers N``, the
ranks being the workers (docs/horovod.md). ``-H`` naming only this machine is
taken (its slots must hold the ranks); other hosts are one line, since
tfcluster starts no process over ssh: each host runs ``tfcluster start``, or
Slurm starts them.
"""

import argparse
import shlex
import socket

from ..core.errors import TfclusterError
from . import local

#: The names of this machine in a host list.
_THIS_HOST = ("localhost", "127.0.0.1", "::1")


def add_parser(sub):
    """The ``horovodrun`` subcommand and its options (Horovod's names)."""
    hr = sub.add_parser("horovodrun", help="run a Horovod program as horovodrun -np N did (TF1 mode, N workers)",
                        usage="tfcluster horovodrun -np N [-H HOST:SLOTS,...] [--verbose] COMMAND [ARGS ...]",
                        description="Run a Horovod TF 1.x program on N workers of this machine: the same as "
                                    "'tfcluster local --tf1 --ps 0 --workers N -- COMMAND' (printed first). "
                                    "Use 'tfcluster local' for its other options (--max-restarts, --timeout).")
    hr.add_argument("-np", "--num-proc", type=int, required=True, metavar="N", help="how many ranks (workers)")
    hr.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                    help="hosts and their slots; only this machine (localhost) is run here")
    hr.add_argument("--hostfile", metavar="FILE", help="refused: tfcluster starts no process on other hosts")
    hr.add_argument("--verbose", action="store_true", help="TensorFlow's own logs too")
    hr.set_defaults(func=run)
    return hr


def local_words(args) -> list:
    """The ``tfcluster local`` options this ``horovodrun`` line means (a bad line is one error)."""
    if args.num_proc < 1:
        raise TfclusterError(f"-np {args.num_proc}: give 1 or more ranks")
    if args.hostfile:
        raise TfclusterError("--hostfile: tfcluster starts no process on other hosts; run 'tfcluster start' on "
                             "each (or under Slurm), see docs/horovod.md")
    if args.hosts:
        slots = 0
        for entry in args.hosts.split(","):
            host, _, count = entry.strip().partition(":")
            if host not in _THIS_HOST + (socket.gethostname(),):
                raise TfclusterError(f"-H {args.hosts}: {host} is another host, and tfcluster starts no process "
                                     "over ssh; run 'tfcluster start --job worker --task I ...' on each host (or "
                                     "under Slurm), see docs/horovod.md")
            slots += int(count) if count.isdigit() else 1
        if slots < args.num_proc:
            raise TfclusterError(f"-np {args.num_proc} needs {args.num_proc} slots; -H {args.hosts} has {slots}")
    return ["--tf1", "--ps", "0", "--workers", str(args.num_proc)] + (["--verbose"] if args.verbose else [])


def run(args) -> int:
    """Print the ``tfcluster local`` line this means, then run it."""
    if not args.command:
        raise TfclusterError("no command to run, e.g. tfcluster horovodrun -np 2 python train.py")
    words = local_words(args)
    print(f"[tfcluster] horovodrun is: tfcluster local {' '.join(words)} -- {shlex.join(args.command)}", flush=True)
    parser = local.add_parser(argparse.ArgumentParser().add_subparsers())
    local_args = parser.parse_args(words)
    local_args.command, local_args.parser = args.command, parser
    return local.run(local_args)
