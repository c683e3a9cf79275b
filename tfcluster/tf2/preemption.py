"""SIGTERM ends a TF 2 trainer at once, as it did before TF's coordination service took the signal for itself.

TF's ``MultiWorkerMirroredStrategy`` (what TF2 mode makes of a one-process
strategy on several trainers, and what TF's multi-worker tutorial builds)
starts TF's coordination service, whose preemption notifier (C++) takes SIGTERM
and only records it, for TF's ``PreemptionCheckpointHandler``. A program that
uses none trains on through the scheduler's grace until its SIGKILL: measured,
a ``tfcluster local --tf2`` cluster trained 30 s more, to ``--stop-grace``'s
SIGKILL. TF2 mode gives SIGTERM back once the strategy has started: the trainer
says so in one line and exits 143 at once. Keras's ``BackupAndRestore`` then
resumes at the epoch the signal interrupted (its backup of the epoch before), a
custom loop at its last checkpoint (docs/tf2.md, "Faults"). A program that makes
a ``PreemptionCheckpointHandler`` installs its handler after this one and keeps it.
"""

import os
import signal
import sys

from ..core.patches import Patch, register
from ..runtime.preemption import PREEMPTED_EXIT
from ..topology.cluster import Cluster


def _stop_now(signum, frame):
    """SIGTERM's handler: one line, then the process ends as the signal would have ended it (143)."""
    task = Cluster.from_environment().task
    sys.stderr.write(f"tfcluster: warning: {task if task is not None else 'this process'} stopped on SIGTERM: TF 2 "
                     f"training saves nothing on it (Keras's BackupAndRestore resumes at the epoch in flight, a custom "
                     f"loop at its last checkpoint)\n")
    sys.stderr.flush()
    sys.stdout.flush()
    # At once, as the signal's own default would: an interpreter's teardown waits on TF's coordination service.
    os._exit(PREEMPTED_EXIT)


def sigterm_back(original):
    """``CollectiveAllReduceExtended._initialize_multi_worker`` that hands SIGTERM back to the process after it."""
    def _initialize_multi_worker(self, cluster_resolver, *args, **kwargs):
        result = original(self, cluster_resolver, *args, **kwargs)
        try:
            signal.signal(signal.SIGTERM, _stop_now)
        except ValueError:          # a strategy made off the main thread: TF keeps the signal
            pass
        return result
    return _initialize_multi_worker


_WHY = ("a TF 2 trainer on a cluster ends at SIGTERM, which TF's coordination service otherwise takes and only "
        "records")
register(Patch("tf2.sigterm_back",
               "tensorflow.python.distribute.collective_all_reduce_strategy:"
               "CollectiveAllReduceExtended._initialize_multi_worker", _WHY, sigterm_back, "TF2 mode",
               params=("self", "cluster_resolver")))

#: The patches of this module TF2 mode installs.
PATCHES = ("tf2.sigterm_back",)
