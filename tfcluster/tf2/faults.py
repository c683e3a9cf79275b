"""A trainer whose all-reduce group lost a member says so in one line naming it, and exits 3.

TF's ``MultiWorkerMirroredStrategy`` (what TF2 mode makes of a one-process
strategy on a cluster, and what TF's multi-worker tutorial builds) all-reduces
under TF's coordination service, to which every trainer sends heartbeats. A
trainer that stops (killed, hung, its host gone) is named to the others once
it missed heartbeats for :data:`HEARTBEAT_TIMEOUT_SECS`; a call to a trainer
whose process is gone fails at once. Either way the collective is aborted for
good, and TF raises ``UnavailableError`` with the op's traceback. TF2 mode says
it in one line naming the trainer gone (exit 3, a peer lost:
:mod:`tfcluster.core.exits`). Only a restart of every trainer goes on
(``tfcluster local --max-restarts``), from the program's own checkpoint (Keras's
``BackupAndRestore``); docs/tf2.md, "Faults".
"""

from typing import Optional, Tuple

from ..core import tferrors
from ..core.exits import EXIT_UNREACHABLE
from ..topology.cluster import Cluster

#: TF's coordination service's heartbeat timeout (its default, which MultiWorkerMirroredStrategy keeps): the bound
#: on naming a trainer that stopped answering; one whose process is gone is named at the next call to it.
HEARTBEAT_TIMEOUT_SECS = 10

_HOW = {"heartbeats": f"sent no heartbeat for {HEARTBEAT_TIMEOUT_SECS}s (TF's coordination service)",
        "connection": "closed its connection under a collective call (its process is gone)"}


def lost_peer_line(error) -> Optional[Tuple[str, int]]:
    """``(line, 3)`` when ``error`` says other trainers are gone, else None."""
    lost = tferrors.lost_peers(error)
    if not lost:
        return None
    tasks, how = lost
    task = Cluster.from_environment().task
    me = str(task) if task is not None else "this process"
    return (f"{me}: {', '.join(tasks)} {_HOW[how]}: the all-reduce cannot go on without every trainer, so "
            f"{me} stops; tfcluster local --max-restarts restarts the trainers together, and Keras's "
            f"BackupAndRestore resumes from its backup (docs/tf2.md, \"Faults\")"), EXIT_UNREACHABLE
