"""TF 1.x's ``SyncReplicasOptimizer``, with each step made of distinct workers' gradients.

TensorFlow's SyncReplicasOptimizer aggregates ``replicas_to_aggregate``
*gradients*, not workers (docs/pitfalls.md, item 5): its workers share one
token queue, which starts with R tokens, so a fast worker takes the tokens
meant for the others and fills a step with its own repeated gradients while
they are still starting. Its result then differs from one process on the
global batch, silently.

:class:`SyncReplicasOptimizer` has the same API and the same hook
(``make_session_run_hook``, ``get_chief_queue_runner``, ``chief_init_op``...),
so TF 1.x programs and Estimator ``model_fn``s use it unchanged (TF1 mode and
``tfcluster.estimator`` give it as ``tf.train.SyncReplicasOptimizer``). What
differs is the tokens (:class:`FairSync`): each worker has its own token
queue, the chief puts one token in each after every update (only into an
empty queue), and no token is handed out before the first update. A worker
therefore contributes at most one gradient to each step, and with every worker
aggregated the run computes exactly what one process computes on the global
batch. A worker's next step reads the step counter afresh, so one that fell
behind (a backup) rejoins the current step. :func:`for_keras` gives a tf-keras
optimizer the same steps.

A worker finds its own queue from TF_CONFIG (which tfcluster gives every
task) or, without one, from the device its ops are placed on
(``/job:worker/task:k``, as ``replica_device_setter`` places them).
"""

import re

import tensorflow as tf
from tensorflow.python.training import sync_replicas_optimizer as _tf_sync

tf1 = tf.compat.v1


def trainer_index(anchor_device: str, total: int) -> int:
    """This worker's index among the ``total`` trainers (chief first)."""
    from ..topology.cluster import Cluster
    try:
        cluster = Cluster.from_environment()
    except Exception:  # a TF_CONFIG this process does not train in: fall back to the device
        cluster = None
    if cluster is not None and cluster.task is not None and cluster.task in cluster.trainers():
        return cluster.trainers().index(cluster.task)
    m = re.search(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)", anchor_device or "")
    if m is None or m.group(1) in ("chief", "master"):
        return 0
    return min(int(m.group(2)), total - 1)


class FairSync:
    """The graph of a fair sync step for any optimizer: accumulators, one token queue per worker.

    ``apply(aggregated grads_and_vars)`` builds the real update (it must
    increase ``step``); ``train_op`` is this worker's step (push, wait for its
    token), ``sync_op`` the chief's (take R gradients, apply, one token each).
    """

    def __init__(self, grads_and_vars, apply, step, replicas_to_aggregate: int, total: int, me: int,
                 name: str = "sync_replicas"):
        self.step, self.r, self.total, self.me = step, replicas_to_aggregate, total, me
        self.accumulators = []
        anchor = tf.no_op()      # lands where the device functions put this worker's ops
        with tf1.device(anchor.device):
            self.local_step = tf1.Variable(0, trainable=False, collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                                           dtype=step.dtype.base_dtype, name="sync_rep_local_step")
        self.local_step_init_op = tf1.assign(self.local_step, step)
        with tf1.name_scope(None, name):
            pushes, aggregated = self._accumulate(grads_and_vars)
            with tf1.device(step.device), tf1.name_scope(""):
                update = apply(aggregated)
                self.queues = [tf1.FIFOQueue(2, step.dtype.base_dtype, shapes=(), name=f"sync_token_q_{i}",
                                             shared_name=f"tfcluster_sync_token_q_{i}") for i in range(total)]
                with tf.control_dependencies(pushes):
                    token = self.queues[min(me, total - 1)].dequeue()
                with tf.control_dependencies([token]):
                    # The step after the update, read now: a token that waited does not hold an old step.
                    self.train_op = tf1.assign(self.local_step, tf.identity(step))
                with tf.control_dependencies([update]):
                    self.sync_op = tf.group(*[self._wake(q) for q in self.queues])
        inits = [self.local_step_init_op]
        for accum, device in self.accumulators:
            with tf1.device(device):
                inits.append(accum.set_global_step(step, name="SetGlobalStep"))
        self.chief_init_op = tf.group(*inits)
        self.queue_runner = tf1.train.QueueRunner(self.queues[0], [self.sync_op])
        self._coord = None

    def _accumulate(self, grads_and_vars):
        """Each gradient into its variable's accumulator; ``(pushes, aggregated (grad, var) pairs)``."""
        pushes, aggregated = [], []
        for grad, var in grads_and_vars:
            with tf1.device(var.device):
                if grad is None:
                    aggregated.append((None, var))
                    continue
                if isinstance(grad, tf.IndexedSlices):
                    accum = tf1.SparseConditionalAccumulator(grad.dtype, shape=(),
                                                             shared_name=var.name + "/grad_accum")
                    pushes.append(accum.apply_indexed_slices_grad(grad, local_step=self.local_step))
                    aggregated.append((accum.take_indexed_slices_grad(self.r), var))
                else:
                    accum = tf1.ConditionalAccumulator(grad.dtype, shape=var.get_shape(),
                                                       shared_name=var.name + "/grad_accum")
                    pushes.append(accum.apply_grad(grad, local_step=self.local_step))
                    aggregated.append((accum.take_grad(self.r), var))
                self.accumulators.append((accum, var.device))
        return pushes, aggregated

    def _wake(self, queue):
        """One token for a worker, unless one already waits for it."""
        def put():
            with tf.control_dependencies([queue.enqueue(tf.identity(self.step))]):
                return tf.constant(True)
        return tf1.cond(tf.equal(queue.size(), 0), put, lambda: tf.constant(False))

    def start(self, session, chief: bool):
        """Ready this worker's local step; on the chief, also the accumulators and the thread that applies."""
        session.run(self.chief_init_op if chief else self.local_step_init_op)
        if chief:
            self._coord = tf1.train.Coordinator()
            self.queue_runner.create_threads(session, coord=self._coord, daemon=True, start=True)

    def stop(self):
        """Stop the chief's applying thread (its blocked run ends when the session closes)."""
        if self._coord is not None:
            self._coord.request_stop()


class SyncReplicasOptimizer(_tf_sync.SyncReplicasOptimizer):
    """``tf.compat.v1.train.SyncReplicasOptimizer`` whose steps take one gradient per distinct worker."""

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Push this worker's gradients for its step, then wait for the chief's update (see the module doc)."""
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            raise ValueError("Must supply at least one variable")
        if global_step is None:
            raise ValueError("Global step is required to check staleness")
        self._global_step = global_step
        me = trainer_index(tf.no_op().device, self._total_num_replicas)
        fair = FairSync(grads_and_vars, lambda agg: self._opt.apply_gradients(agg, global_step), global_step,
                        self._replicas_to_aggregate, self._total_num_replicas, me, self._name)
        sync_op = fair.sync_op
        if self._variable_averages is not None:
            with tf.control_dependencies([sync_op]), tf1.name_scope(""):
                sync_op = self._variable_averages.apply(self._variables_to_average)
        self._fair = fair
        self._local_step = fair.local_step
        self.local_step_init_op = fair.local_step_init_op
        self.chief_init_op = fair.chief_init_op
        self.ready_for_local_init_op = tf1.report_uninitialized_variables(tf1.global_variables())
        self._accumulator_list = fair.accumulators
        self._sync_token_queue = fair.queues[0]
        self._chief_queue_runner = tf1.train.QueueRunner(fair.queues[0], [sync_op])
        self._gradients_applied = True
        return fair.train_op

    def get_init_tokens_op(self, num_tokens=-1):
        """No tokens ahead of the first update: that is what let one worker fill a step alone."""
        if self._gradients_applied is False:
            raise ValueError("get_init_tokens_op() should be called after apply_gradients().")
        return tf.no_op(name="no_init_tokens")


def for_keras(optimizer, total: int, me: int) -> "KerasSync":
    """Make a tf-keras optimizer's updates fair sync steps over ``total`` workers; call before the train function."""
    return KerasSync(optimizer, total, me)


class KerasSync:
    """A tf-keras optimizer whose ``apply_gradients`` builds a :class:`FairSync` step (every worker aggregated)."""

    def __init__(self, optimizer, total: int, me: int):
        self.fair = None
        original = optimizer.apply_gradients

        def apply_gradients(grads_and_vars, name=None, **kwargs):
            self.fair = FairSync(list(grads_and_vars), lambda agg: original(agg, **kwargs), optimizer.iterations,
                                 total, total, me, name or "sync_replicas")
            return self.fair.train_op
        optimizer.apply_gradients = apply_gradients

    def start(self, session, chief: bool):
        """See :meth:`FairSync.start`."""
        self.fair.start(session, chief)

    def stop(self):
        """See :meth:`FairSync.stop`."""
        if self.fair is not None:
            self.fair.stop()
