"""``tfcluster status``: which tasks of a cluster answer."""

import sys

from ..core.exits import EXIT_DOWN
from .common import add_cluster_args, cluster_from_args


def add_parser(sub):
    """The ``status`` subcommand and its options."""
    st = sub.add_parser("status", help="show which tasks of a cluster are up",
                        description="Probe every task over gRPC and print job, index, address and up/down. "
                                    "Exits 1 when any task is down.")
    add_cluster_args(st, task=False)
    st.add_argument("--timeout", type=float, default=2.0, metavar="S",
                    help="seconds to wait for each task to answer (default 2)")
    st.set_defaults(func=run)
    return st


def run(args) -> int:
    """Print one row per task (job, index, address, up/down); exit 1 if any is down."""
    cluster = cluster_from_args(args, need_task=False)
    from ..runtime.server import TaskState, probe
    states = probe(cluster, timeout=args.timeout)
    print(f"{'JOB':<8} {'INDEX':>5}  {'ADDRESS':<28} STATE")
    for t, state in states.items():
        print(f"{t.job:<8} {t.index:>5}  {cluster.address(t):<28} {state}")
    down = [t for t, s in states.items() if s is not TaskState.UP]
    if down:
        print(f"tfcluster: {len(down)} of {len(states)} task(s) down: "
              + ", ".join(str(t) for t in down), file=sys.stderr)
        return EXIT_DOWN
    return 0
