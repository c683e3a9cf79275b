"""Restarts: a task that crashed starts again on its port, alone or with every trainer of its all-reduce group.

``--max-restarts K`` restarts a crashed task up to K times with the same
TF_CONFIG and port. A trainer of an all-reduce group (Horovod, a
``MultiWorkerMirroredStrategy``, tfcluster's collective strategy: several
trainers, no ps) cannot come back alone: the group is fixed when it is made,
and one new member would fail the others in turn. There every trainer restarts with it
(:attr:`~tfcluster.launch.config.LaunchConfig.trainers_restart_together`; docs/tf2.md, "Faults").
"""

import logging
from typing import Optional

from ..topology.ports import hold_port

log = logging.getLogger("tfcluster")


class Restarts:
    """Starts crashed tasks of one launch again; see the module doc."""

    def __init__(self, config, writer, group, lock):
        self.config = config
        self.writer = writer
        self.group = group          # the launch's TaskGroup: its tasks, and how to stop them
        self.lock = lock            # held while a task's port placeholder changes hands

    def one(self, p, why: Optional[str] = None):
        """Start the crashed task ``p`` again, on its port (held again until it serves); ``why``: it crashed,
        said unless None (said already)."""
        p.restarts += 1
        if why is not None:
            log.warning("%s %s; restarting it (restart %d of %d, same TF_CONFIG and port)",
                        p.name, why, p.restarts, self.config.max_restarts)
        with self.lock:
            if p.placeholder is None and p.port is not None:
                p.placeholder = hold_port(p.port, self.config.host)
                if p.placeholder is None:
                    log.debug("could not hold port %d again for %s; it restarts without a placeholder",
                              p.port, p.name)
            p.start(self.writer)
        log.info("%s restarted (pid %d)", p.name, p.popen.pid)

    def trainers(self, p, why: str):
        """The trainer ``p`` crashed (``why``): stop the trainers still running, then start every trainer again."""
        trainers = [q for q in self.group.procs if q.is_trainer]
        log.warning("%s %s; its all-reduce group cannot take it back alone, so every trainer restarts (restart %d "
                    "of %d, same TF_CONFIG and ports; they resume from the chief's checkpoint or Keras's backup)",
                    p.name, why, p.restarts + 1, self.config.max_restarts)
        running = [q for q in trainers if q.running]
        if running:
            log.info("stopping %s for the restart", ", ".join(q.name for q in running))
            self.group.stop(running)
        for q in trainers:
            self.group.stop_leftovers(q)
            q.drain(1.0)
            self.one(q)
