"""TF 1.x's ``SyncReplicasOptimizer`` on tfcluster's sync step: one gradient per distinct worker, every wait bounded.

TensorFlow's SyncReplicasOptimizer aggregates ``replicas_to_aggregate``
*gradients*, not workers (docs/pitfalls.md, item 5), and its waits (a worker's
token, the chief's ``take_grad``) have no timeout: a worker that dies stalls
every other one, silently, for ever. This class has the same API
(``minimize``, ``apply_gradients``, ``make_session_run_hook``,
``get_chief_queue_runner``, ``chief_init_op``...), so TF 1.x programs,
Estimator ``model_fn``\\ s and slim use it unchanged (TF1 mode and
``tfcluster.estimator`` give it as ``tf.train.SyncReplicasOptimizer``), and it
builds ``fit``'s sync step (:mod:`.sync`):

- the train op pushes this worker's gradients into its own slots on the ps;
- every run in which this worker pushed is followed, inside ``Session.run``,
  by the step's wait (:class:`~.sync_run.SyncFinish`): a worker waits until
  the chief applied the step; the chief waits for R distinct workers'
  gradients and applies them once. One thread looks at a time for each
  worker, so when another thread's run (a Supervisor's checkpoint thread)
  looks first and takes the wait, the run that pushed still returns only
  after it. Each wait is bounded: after ``stall_warn_secs`` it names the workers that have
  not pushed, after ``stall_timeout_secs`` it stops with
  :class:`~tfcluster.core.errors.SyncStallError`;
- no thread of the chief's applies updates: ``get_chief_queue_runner`` gives
  a runner that ends at once, and ``get_init_tokens_op`` a no-op.

With every worker aggregated, the run computes exactly what one process
computes on the global batch. A worker finds its place among the trainers from
TF_CONFIG or, without one, from the device its ops are placed on
(``/job:worker/task:k``, as ``replica_device_setter`` places them).
"""

import logging
import threading
import time

import tensorflow as tf
from tensorflow.python.framework import ops as _ops
from tensorflow.python.training import sync_replicas_optimizer as _tf_sync

from ..core import patches
from ..core.errors import SpecError, SyncStallError
from ..runtime.server import READY_POLL_SECS
from ..topology.cluster import Cluster, Role, Task
from .sync import SyncGraph
from .sync_run import SyncFinish, stall_defaults

tf1 = tf.compat.v1
log = logging.getLogger("tfcluster")

#: The graph collection that holds each SyncReplicasOptimizer's :class:`~.sync_run.SyncFinish`.
FINISH_COLLECTION = "tfcluster_sync_finish"


def _not_in_meta_graphs(value, export_scope=None):
    """A SyncFinish is Python state: a saved meta graph (a Supervisor's Saver writes one) leaves it out, quietly."""
    return None


_ops.register_proto_function(FINISH_COLLECTION, proto_type=None, to_proto=_not_in_meta_graphs)

#: Threads whose runs never push (input queue runners, tfcluster's own): no wait is looked for after them.
_QUIET_THREADS = ("QueueRunnerThread-", "tfcluster-")


def trainer_index(anchor_device: str, total: int) -> int:
    """This worker's index among the ``total`` trainers (chief first)."""
    try:
        cluster = Cluster.from_environment()
    except Exception:  # a TF_CONFIG this process does not train in: fall back to the device
        cluster = None
    if cluster is not None and cluster.task is not None and cluster.task in cluster.trainers():
        return cluster.trainers().index(cluster.task)
    task = Task.of_device(anchor_device)
    if task is None or task.role is Role.CHIEF:
        return 0
    return min(task.index, total - 1)


def _trainer_names(total: int) -> list:
    try:
        cluster = Cluster.from_environment()
    except Exception:  # named by index instead
        cluster = None
    if cluster is not None and cluster.num_replicas == total:
        return [str(t) for t in cluster.trainers()]
    return [f"trainer {i}" for i in range(total)]


class SyncReplicasOptimizer(_tf_sync.SyncReplicasOptimizer):
    """``tf.compat.v1.train.SyncReplicasOptimizer`` whose steps take one gradient per distinct worker, bounded.

    Beyond TF's arguments: ``stall_warn_secs`` and ``stall_timeout_secs``
    (default ``TFCLUSTER_SYNC_STALL_SECS`` and ``TFCLUSTER_SYNC_TIMEOUT_SECS``,
    else 30 and 600).
    """

    def __init__(self, opt, replicas_to_aggregate, total_num_replicas=None, variable_averages=None,
                 variables_to_average=None, use_locking=False, name="sync_replicas", stall_warn_secs=None,
                 stall_timeout_secs=None):
        super().__init__(opt, replicas_to_aggregate, total_num_replicas, variable_averages, variables_to_average,
                         use_locking, name)
        self._stall = stall_defaults(stall_warn_secs, stall_timeout_secs)
        self._finish = None
        finish_after_pushing_runs()

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """This worker's train op: push its gradients for its step (the wait follows the run; module doc)."""
        grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
        if not grads_and_vars:
            raise ValueError("Must supply at least one variable")
        if global_step is None:
            raise ValueError("Global step is required to check staleness")
        total, r = self._total_num_replicas, self._replicas_to_aggregate
        if not 1 <= r <= total:
            raise SpecError(f"SyncReplicasOptimizer: replicas_to_aggregate={r} must be between 1 and "
                            f"total_num_replicas={total}")
        self._global_step = global_step
        worker = tf.no_op(name="sync_worker_anchor").device     # where the device functions put this worker's ops
        graph = SyncGraph(_trainer_names(total), trainer_index(worker, total), r, global_step, grads_and_vars,
                          self._apply, worker, average=True)
        stamped, _ = graph.push()
        train_op = stamped if graph.is_chief else graph.arrive([stamped])
        self._finish = SyncFinish(graph, *self._stall)
        tf1.add_to_collection(FINISH_COLLECTION, self._finish)
        self._graph = graph
        self.local_step_init_op = graph.local_step_init
        self.chief_init_op = tf.group(*graph.chief_init_ops())
        # A worker's local init waits for the sync state the chief's local init (chief_init_op) readies, so
        # the chief's own check leaves that state out (slim's Supervisor uses this one op for both).
        waits_for = [] if graph.is_chief else graph.state_variables
        self.ready_for_local_init_op = tf1.report_uninitialized_variables(tf1.global_variables() + waits_for)
        self._state_ready = tf1.report_uninitialized_variables(graph.state_variables)
        for check in (self.ready_for_local_init_op, self._state_ready):
            check.mark_used()   # a program may pass neither (MonitoredTrainingSession): TF's "never used" is noise
        self._local_step = graph.local_step
        self._chief_queue_runner = _ending_queue_runner(worker)
        self._gradients_applied = True
        return train_op

    def _apply(self, aggregated):
        """The real update of an aggregated step, then the variable averages if any."""
        update = self._opt.apply_gradients(aggregated, self._global_step)
        if self._variable_averages is None:
            return update
        with tf.control_dependencies([update]), tf1.name_scope(""):
            return self._variable_averages.apply(self._variables_to_average)

    def get_init_tokens_op(self, num_tokens=-1):
        """No tokens: a worker waits for the update itself, so there is nothing to hand out."""
        if self._gradients_applied is False:
            raise ValueError("get_init_tokens_op() should be called after apply_gradients().")
        return tf.no_op(name="no_init_tokens")

    def make_session_run_hook(self, is_chief, num_tokens=-1):
        """The hook that readies each new session: the chief's sync state, a worker's local step."""
        return _SyncHook(self, is_chief)


def _ending_queue_runner(device: str):
    """A QueueRunner whose one thread ends at once: updates are applied in the chief's own steps."""
    with tf1.device(device), tf1.name_scope("tfcluster_sync/"):
        queue = tf1.FIFOQueue(1, [tf.int32], shapes=[[]], name="no_chief_thread")
        with tf.control_dependencies([queue.close()]):
            ends = queue.dequeue()          # an empty, closed queue: OutOfRange, and the thread ends
    return tf1.train.QueueRunner(queue, [ends])


class _SyncHook(tf1.train.SessionRunHook):
    """After each session creation: the chief readies the sync state; a worker waits for it (bounded)."""

    def __init__(self, optimizer, is_chief):
        self._optimizer, self._is_chief = optimizer, is_chief

    def begin(self):
        """The optimizer must have built its step."""
        if not self._optimizer._gradients_applied:
            raise ValueError("SyncReplicasOptimizer.apply_gradients should be called before using the hook.")

    def after_create_session(self, session, coord):
        """Chief: initialise the sync state where needed and reset its stamps; worker: wait for that."""
        _ready(session, self._optimizer, self._is_chief)


#: Seconds a worker waits for the chief to ready the sync state of a new session.
READY_TIMEOUT_SECS = 300.0


def _ready(session, step, chief: bool):
    """Ready a new session for ``step`` (it has ``chief_init_op``, ``local_step_init_op``, ``_state_ready``)."""
    if chief:
        session.run(step.chief_init_op)
        return
    started = time.monotonic()
    while len(session.run(step._state_ready)):
        if time.monotonic() - started > READY_TIMEOUT_SECS:
            raise SyncStallError(f"the chief did not ready the sync step's state on the ps within "
                                 f"{READY_TIMEOUT_SECS:g}s; is it running?")
        time.sleep(READY_POLL_SECS)
    session.run(step.local_step_init_op)


def for_keras(optimizer, trainers, index: int) -> "KerasSync":
    """Make a tf-keras optimizer's updates sync steps over ``trainers`` (this one is ``trainers[index]``); call
    before its train function is built."""
    return KerasSync(optimizer, trainers, index)


class KerasSync:
    """A tf-keras optimizer whose updates push for a sync step that aggregates every trainer.

    Once the train function is built, ``graph`` is its :class:`~.sync.SyncGraph`
    and ``finish`` the wait each step needs after its push (a
    :class:`~.sync_run.FinishingRunner` runs it); :meth:`release` then gives
    the optimizer its own ``apply_gradients`` back. A tf-keras optimizer
    applies through its own ``apply_gradients``; one that wraps a TF 1.x
    ``tf.train`` optimizer (``compile(optimizer=tf.train.AdamOptimizer())``)
    through the wrapped one's, which the user's model shares.
    """

    def __init__(self, optimizer, trainers, index: int):
        self.graph = self.finish = None
        names = [str(t) for t in trainers]
        inner = getattr(optimizer, "optimizer", None)
        self._target = inner if isinstance(inner, tf1.train.Optimizer) else optimizer
        original = self._target.apply_gradients

        def apply_gradients(grads_and_vars, *args, **kwargs):
            worker = tf.no_op(name="sync_worker_anchor").device
            grads = [(g, v) for g, v in grads_and_vars if g is not None]
            self.graph = graph = SyncGraph(names, index, len(names), optimizer.iterations, grads,
                                           lambda aggregated: original(aggregated, *args, **kwargs), worker,
                                           average=True)
            stamped, _ = graph.push()
            self.finish = SyncFinish(graph, *stall_defaults())
            return stamped if graph.is_chief else graph.arrive([stamped])
        self._target.apply_gradients = apply_gradients

    def release(self):
        """Give the optimizer its own ``apply_gradients`` back (the train function is built)."""
        self._target.__dict__.pop("apply_gradients", None)


# ------------------------------------------------------------------ the wait after a pushing run
_busy = threading.local()
patches.register_session_layer(patches.SessionLayer(
    "finish-sync-pushes", 10, "a run that pushed a sync gradient waits for (on the chief: applies) its step before "
    "it returns, whichever thread of the session runs next (tf-keras makes its callables from options)",
    lambda session, fn: _finishing(session, fn), "SyncReplicasOptimizer's first apply_gradients",
    entries=patches.SESSION_ENTRIES))


def finish_after_pushing_runs():
    """Make every ``Session.run`` and session callable follow a run that pushed with that step's wait."""
    patches.add_session_layer("finish-sync-pushes")


def _finishing(session, fn):
    def call(*args, **kwargs):
        result = fn(*args, **kwargs)
        _finish_pushes(session)
        return result
    call.__wrapped__ = fn
    return call


def _finish_pushes(session):
    """After a run: when this worker pushed, wait for (on the chief: apply) the step it pushed for."""
    if getattr(_busy, "on", False) or threading.current_thread().name.startswith(_QUIET_THREADS):
        return
    finishes = session.graph.get_collection(FINISH_COLLECTION) if session.graph is not None else []
    if not finishes:
        return
    _busy.on = True
    try:
        for finish in finishes:
            # Without one look at a time, two threads that both saw the push count move finished one push twice
            # (the second then waited for a step this worker never pushed for: a slim chief hung so, its
            # Supervisor's checkpoint thread looking just after the train thread's push), or the thread that
            # pushed returned, and pushed again, before the other had applied the step. The lock is the
            # worker's own: workers trained by threads of one process (TF's own SyncReplicasOptimizer test)
            # each wait for the others' pushes, which a lock for the whole process would hold back.
            with finish.looking:
                if not finish.driven and finish.pushed(session):
                    finish.finish()
    finally:
        _busy.on = False
