"""Peer: TF2 ParameterServerStrategy with a ClusterCoordinator, the TF2 way to train on ps.

TF_CONFIG names a chief (the coordinator), workers and ps. Workers and ps only
serve (server.join()); the chief schedules steps and measures throughput.

Written as TF's ParameterServerStrategy tutorial writes its custom loop, at
its best: a tf.function step per ``schedule`` call, every step of the run
(``BENCH_STEPS``, the global steps the tfcluster rows take) scheduled at once,
one ``join()`` at the end. Joining every few steps would drain the workers'
queues each time and make the peer look slower than it is.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorflow as tf  # noqa: E402

from common import CLASSES, HIDDEN, INPUT, pss_role, pss_timed, synthetic  # noqa: E402

batch = int(os.environ.get("BENCH_BATCH", "128"))
steps = int(os.environ.get("BENCH_STEPS", "1500"))
resolver = pss_role(tf)

strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    w1 = tf.Variable(tf.random.stateless_uniform([INPUT, HIDDEN], [1, 2], -0.06, 0.06))
    b1 = tf.Variable(tf.zeros([HIDDEN]))
    w2 = tf.Variable(tf.random.stateless_uniform([HIDDEN, CLASSES], [3, 4], -0.1, 0.1))
    b2 = tf.Variable(tf.zeros([CLASSES]))
params = [w1, b1, w2, b2]
data_x, data_y = synthetic()


def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((data_x, data_y)).shuffle(8192).repeat().batch(batch).prefetch(2)


per_worker_iter = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def step(iterator):
    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, w1) + b1)
            logits = tf.matmul(h, w2) + b2
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for v, g in zip(params, tape.gradient(loss, params)):
            v.assign_sub(0.01 * g)
        return loss
    return strategy.run(replica_fn, args=next(iterator))



pss_timed(coordinator, step, per_worker_iter, steps, batch, peer="tf2_pss")
