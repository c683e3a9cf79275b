"""A task that only serves ends with its chief: ``server.join()`` returns once the chief is done.

TF 2's ``ParameterServerStrategy`` programs (TF's parameter-server tutorial)
start a ``tf.distribute.Server`` on every worker and ps and ``server.join()``:
in TF they serve for ever, and a job under Slurm, Kubernetes or ``tfcluster
local`` never ends. Under TF2 mode a task of a cluster with a chief, other than
the chief, returns from ``join()`` once the chief's address has answered and
then stopped answering (the chief's process is gone); the program goes on from
there, normally to its end. Until the chief first answers, a task looks often:
a chief whose program is short serves for about a second (TF's parameter-server
tutorial with ``fit``, tests/test_tf2.py), and a task that looked once a second
could miss all of it and wait for ever.
"""

import logging
import socket
import time

from ..core.patches import Patch, register
from ..topology.cluster import Cluster, parse_address

log = logging.getLogger("tfcluster")

#: Seconds between two looks at whether the chief still answers.
CHIEF_POLL_SECS = 1.0
#: Seconds between two looks until the chief first answers (a refused connection costs microseconds).
CHIEF_FIRST_POLL_SECS = 0.05
#: Looks in a row at which the chief did not answer before it counts as gone (a busy chief may miss one).
CHIEF_GONE_LOOKS = 3


def answers(address: str, timeout: float = CHIEF_POLL_SECS) -> bool:
    """True when something accepts a TCP connection at ``host:port``."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_for_chief_to_end(address: str, poll: float = CHIEF_POLL_SECS, first_poll: float = CHIEF_FIRST_POLL_SECS):
    """Return once ``address`` has answered and then not answered ``CHIEF_GONE_LOOKS`` looks in a row."""
    seen, missed = False, 0
    while True:
        if answers(address, poll):
            seen, missed = True, 0
        elif seen:
            missed += 1
            if missed >= CHIEF_GONE_LOOKS:
                return
        time.sleep(poll if seen else first_poll)


def join_until_the_chief_ends(original):
    """``Server.join`` that, in a task of a cluster with a chief other than the chief, returns when the chief ends."""
    def join(self):
        cluster = Cluster.from_environment()
        chief = cluster.chief_task if cluster is not None and cluster.task is not None else None
        if chief is None or cluster.task == chief:
            return original(self)
        address = cluster.address(chief)
        log.info("%s serves until its chief (%s at %s) ends", cluster.task, chief, address)
        wait_for_chief_to_end(address)
        log.info("%s: its chief (%s) ended: server.join() returns", cluster.task, chief)
    return join


register(Patch("tf2.join_until_the_chief_ends", "tensorflow.python.training.server_lib:Server.join",
               "a worker or ps of TF 2's ParameterServerStrategy returns from server.join() once the chief ended, "
               "instead of serving for ever", join_until_the_chief_ends, "TF2 mode", params=("self",)))

#: The patches of this module TF2 mode installs.
PATCHES = ("tf2.join_until_the_chief_ends",)
