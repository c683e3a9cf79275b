"""``tfcluster spec``: write a cluster spec for one machine and print each terminal's command."""

import shlex
import sys

from ..core.errors import TfclusterError
from ..core.private import open_private
from ..topology.cluster import Cluster, Role
from .common import task_count


def add_parser(sub):
    """The ``spec`` subcommand and its options."""
    sp = sub.add_parser("spec", help="write a cluster spec for one machine and print each terminal's command",
                        description="Write a cluster spec on one host and print the command for each "
                                    "terminal, for a cluster started by hand.",
                        usage="tfcluster spec [--ps N] [--workers M] [--chief] [--host H] [--base-port P] "
                              "[-o FILE] [[--] COMMAND ...]")
    sp.add_argument("--ps", type=task_count, default=1, metavar="N",
                    help="how many parameter servers (default 1); a number here, addresses in start and status")
    sp.add_argument("--workers", type=task_count, default=2, metavar="M", help="how many workers (default 2)")
    sp.add_argument("--chief", action="store_true",
                    help="add a chief task (in start and status, --chief H:P is its address)")
    sp.add_argument("--host", default="localhost", help="host of every task (default localhost)")
    sp.add_argument("--base-port", type=int, metavar="P", help="consecutive ports from P (default: free ports)")
    sp.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: print it)")
    sp.set_defaults(func=run)
    # It prints commands for people to type: a bare script reads best as "python train.py".
    sp.script_interpreter = "python"
    return sp


def run(args) -> int:
    """Write a local cluster spec and print the command for each terminal."""
    cluster = Cluster.local(ps=args.ps, workers=args.workers, chief=args.chief, host=args.host,
                            base_port=args.base_port)
    text = cluster.to_json()
    if args.output:
        try:
            with open_private(args.output) as f:
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
    for t in cluster.tasks(("ps",)) + cluster.trainers():
        tail = "" if t.role is Role.PS else f" -- {script}"
        print(f"tfcluster start --cluster {spec_arg} --job {t.job} --task {t.index}{tail}")
    print(f"# check them: tfcluster status --cluster {spec_arg}")
    return 0
