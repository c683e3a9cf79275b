"""A custom loop that saves at a SIGTERM with TF's ``PreemptionCheckpointHandler`` (TF 2.12-2.15's docs).

As the docstring of ``tf.distribute.experimental.PreemptionCheckpointHandler``
writes it: a ``MultiWorkerMirroredStrategy`` on TF_CONFIG, a
``tf.train.Checkpoint`` and a ``CheckpointManager`` handed to the handler, the
epoch and step to begin at read from ``preemption_handler.total_run_calls``
(restored from the checkpoint), and each step run through
``preemption_handler.run``. At a SIGTERM every trainer saves at the step they
agree on and exits (TF's default: code 42); a rerun begins at the step after it.
Local data; each step prints ``step S done`` (S steps done, counted over the
whole run), ``--step-sleep S`` (a test's knob) makes each step last S seconds more.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--ckpt", required=True)
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--step-sleep", type=float, default=0.0)
args = p.parse_args()

STEPS_PER_EPOCH = 20
cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver)
GLOBAL_BATCH_SIZE = 16 * strategy.num_replicas_in_sync

rng = np.random.RandomState(0)
x = rng.rand(640, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH_SIZE)
iterator = iter(strategy.experimental_distribute_dataset(dataset))

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                reduction=tf.keras.losses.Reduction.NONE)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
    checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=args.ckpt, max_to_keep=1)
    preemption_handler = tf.distribute.experimental.PreemptionCheckpointHandler(cluster_resolver,
                                                                                checkpoint_manager)


def train_step(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(loss_object(labels, model(features, training=True)),
                                          global_batch_size=GLOBAL_BATCH_SIZE)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(inputs):
    per_replica_losses = strategy.run(train_step, args=(inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


print("begins at step {}".format(preemption_handler.total_run_calls), flush=True)
for epoch in range(preemption_handler.total_run_calls // STEPS_PER_EPOCH, args.epochs):
    for step in range(preemption_handler.total_run_calls % STEPS_PER_EPOCH, STEPS_PER_EPOCH):
        preemption_handler.run(distributed_train_step, next(iterator))
        print("step {} done".format(preemption_handler.total_run_calls), flush=True)
        time.sleep(args.step_sleep)
print("trained {} steps".format(args.epochs * STEPS_PER_EPOCH), flush=True)
