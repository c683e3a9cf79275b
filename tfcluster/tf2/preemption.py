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
custom loop at its last checkpoint (docs/tf2.md, "Faults").

Programs that save at the signal keep it: a ``PreemptionCheckpointHandler``
installs its own handler after this one, and every trainer saves at the step
they agree on. tf-keras's ``BackupAndRestore(save_before_preemption=True)``
makes one, but only where it finds Google Cloud's metadata server, and there its
non-chief trainers restore nothing (the handler reads their private write
directory; the chief's restore then waits on collectives they never join: TF's
"Collective instance ... expected type 1 ... but got type 0"). TF2 mode turns it
on for any ``MultiWorkerMirroredStrategy`` and has every trainer restore the
chief's backup, so a SIGTERM loses no step.
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
    sys.stderr.write(f"tfcluster: warning: {task if task is not None else 'this process'} stopped on SIGTERM: nothing "
                     f"saved (Keras's BackupAndRestore resumes at the epoch in flight, a custom loop at its last "
                     f"checkpoint; save_before_preemption=True or a PreemptionCheckpointHandler saves at the step)\n")
    sys.stderr.flush()
    sys.stdout.flush()
    # At once, as the signal's own default would: an interpreter's teardown waits on TF's coordination service.
    os._exit(PREEMPTED_EXIT)


def stop_at_sigterm():
    """Hand SIGTERM back to the process (after TF's coordination service started and took it)."""
    try:
        signal.signal(signal.SIGTERM, _stop_now)
    except ValueError:          # started off the main thread: TF keeps the signal
        pass


def sigterm_back(original):
    """``CollectiveAllReduceExtended._initialize_multi_worker`` that hands SIGTERM back to the process after it."""
    def _initialize_multi_worker(self, cluster_resolver, *args, **kwargs):
        result = original(self, cluster_resolver, *args, **kwargs)
        stop_at_sigterm()
        return result
    return _initialize_multi_worker


def save_before_preemption_anywhere(original):
    """tf-keras's test for ``save_before_preemption``: also true off Google Cloud, for a MultiWorkerMirroredStrategy."""
    def support_on_demand_checkpoint_callback(strategy):
        import tensorflow as tf
        return original(strategy) or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    return support_on_demand_checkpoint_callback


def every_trainer_restores(original):
    """``WorkerTrainingState.restore``: a non-chief restores the chief's backup too when it saves before preemption."""
    def restore(self):
        original(self)
        # The handler restored from the manager it was given, a non-chief's private write directory; tf-keras
        # swaps in the chief's only after that restore.
        if getattr(self, "_enable_save_before_preemption", False) and \
                self.read_checkpoint_manager is not self.write_checkpoint_manager:
            handler = self.preemption_handler
            self.read_checkpoint_manager.restore_or_initialize()
            handler._run_counter = handler._checkpointed_runs.numpy()
    return restore


def quiet_when_the_chief_ends(original):
    """``PreemptionCheckpointHandler._watch_step_to_save_key`` (a thread) ends quietly when the chief's service ends."""
    def _watch_step_to_save_key(self):
        from tensorflow.python.framework import errors
        try:
            original(self)
        # The chief ended its run first and took TF's coordination service with it: no step will be asked to save.
        except (errors.UnavailableError, errors.AbortedError, errors.CancelledError):
            pass
    return _watch_step_to_save_key


_WORKER_STATE = "tf_keras.src.distribute.worker_training_state:"
register(Patch("tf2.save_before_preemption", _WORKER_STATE + "support_on_demand_checkpoint_callback",
               "Keras's BackupAndRestore(save_before_preemption=True) saves at a SIGTERM off Google Cloud too",
               save_before_preemption_anywhere, "TF2 mode, where tf-keras is installed", params=("strategy",),
               optional=True))
register(Patch("tf2.preemption_restore", _WORKER_STATE + "WorkerTrainingState.restore",
               "every trainer restores the backup saved before a preemption, not only the chief (a collective)",
               every_trainer_restores, "TF2 mode, where tf-keras is installed", params=("self",), optional=True))

register(Patch("tf2.preemption_watch_quiet",
               "tensorflow.python.distribute.failure_handling.failure_handling:"
               "PreemptionCheckpointHandler._watch_step_to_save_key",
               "a PreemptionCheckpointHandler's watcher thread ends without a traceback when the chief ends first",
               quiet_when_the_chief_ends, "TF2 mode", params=("self",)))

_WHY = ("a TF 2 trainer on a cluster ends at SIGTERM, which TF's coordination service otherwise takes and only "
        "records")
register(Patch("tf2.sigterm_back",
               "tensorflow.python.distribute.collective_all_reduce_strategy:"
               "CollectiveAllReduceExtended._initialize_multi_worker", _WHY, sigterm_back, "TF2 mode",
               params=("self", "cluster_resolver")))

#: The patches of this module TF2 mode installs.
PATCHES = ("tf2.sigterm_back", "tf2.save_before_preemption", "tf2.preemption_restore",
           "tf2.preemption_watch_quiet")
