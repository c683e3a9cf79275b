"""Workload: the TF 2 tutorials' CNN under a strategy, as ``fit`` or as a custom loop (the TF2 mode rows).

The model of tensorflow.org's "Distributed training with Keras" and "Custom
training with tf.distribute.Strategy" (Conv2D 32 3x3, max-pool, Dense 64, Dense
10) on in-memory MNIST-shaped data. ``--strategy mirrored`` writes
``tf.distribute.MirroredStrategy()`` as the tutorials do (one process; under
``tfcluster local --tf2`` it becomes the cluster's); ``--strategy
multi_worker`` writes TF's ``MultiWorkerMirroredStrategy()``, for two processes
the bench starts by hand on TF_CONFIG. ``--global-batch`` is the batch of one
step over every worker, so each shape steps on the same examples. Each process
prints one BENCH line: its examples per second over its steps.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from common import Meter, report  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--loop", choices=("fit", "custom"), required=True)
p.add_argument("--strategy", choices=("mirrored", "multi_worker"), required=True)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--global-batch", type=int, default=128)
a = p.parse_args()

strategy = (tf.distribute.MirroredStrategy() if a.strategy == "mirrored"
            else tf.distribute.MultiWorkerMirroredStrategy())
GLOBAL_BATCH = a.global_batch
replicas = strategy.num_replicas_in_sync     # one per process here: no GPU
rng = np.random.RandomState(0)
images = rng.rand(4096, 28, 28, 1).astype("float32")
labels = rng.randint(0, 10, 4096).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(GLOBAL_BATCH)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)])
    optimizer = tf.keras.optimizers.Adam()
meter = Meter(GLOBAL_BATCH // replicas)


class Steps(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        meter.step()


if a.loop == "fit":
    with strategy.scope():
        model.compile(optimizer=optimizer, metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, epochs=1, steps_per_epoch=a.steps, verbose=0, callbacks=[Steps()])
else:
    with strategy.scope():
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                    reduction=tf.keras.losses.Reduction.NONE)

    def train_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=GLOBAL_BATCH)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)

    batches = iter(strategy.experimental_distribute_dataset(dataset))
    for _ in range(a.steps):
        float(distributed_train_step(next(batches)))    # the loss read: each step has ended when it is counted
        meter.step()
report(meter.result(peer=f"tf2_{a.loop}_{a.strategy}"))
