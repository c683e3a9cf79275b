"""The TF 2 custom-training-loop tutorial's program, as TF 2.0-2.3 wrote it, on local data.

tensorflow.org's "Custom training with tf.distribute.Strategy" (TF 2.0/2.1): a
``MirroredStrategy``, the global batch as ``per replica * num_replicas_in_sync``,
``experimental_distribute_dataset``, ``strategy.experimental_run_v2`` (TF 2.4
removed it), the loss averaged over the global batch, ``strategy.reduce``, a
Keras metric reset with ``reset_states()``. Its data are generated (no download); the model is the tutorial's shape, smaller.

``--out DIR`` writes the trained weights to ``DIR/weights-<task>.npz``; ``--ckpt DIR``
saves the tutorial's checkpoint there at the end, every worker alike (and a
``CheckpointManager``'s and ``save_weights``' under it);
``--logical-cpus N`` (a test's knob, not the tutorial's) splits this process's
CPU into N devices and mirrors over them, as one machine with N GPUs would.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--logical-cpus", type=int, default=1)
p.add_argument("--ckpt")
args = p.parse_args()

if args.logical_cpus > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)

tf.random.set_seed(7)
rng = np.random.RandomState(0)
images = rng.rand(512, 8, 8, 1).astype("float32")
labels = (images.reshape(512, -1).sum(axis=1) > 32).astype("int64")

devices = [f"/cpu:{i}" for i in range(args.logical_cpus)] if args.logical_cpus > 1 else None
strategy = tf.distribute.MirroredStrategy(devices)
print("Number of devices: {}".format(strategy.num_replicas_in_sync), flush=True)

BATCH_SIZE_PER_REPLICA = 8
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

train_dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)

with strategy.scope():
    # Seeded initial values (the tutorial leaves them random): one process starts where the cluster does.
    init = tf.keras.initializers.GlorotUniform
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, 3, activation="relu", input_shape=(8, 8, 1), kernel_initializer=init(1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init(2)),
        tf.keras.layers.Dense(2, kernel_initializer=init(3)),
    ])
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                reduction=tf.keras.losses.Reduction.NONE)

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)

    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.experimental_run_v2(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


total_loss, steps = 0.0, 0
for x in train_dist_dataset:
    total_loss += distributed_train_step(x)
    steps += 1
    if steps == args.steps:
        break
print("Loss: {}, Accuracy: {}".format(total_loss / steps, train_accuracy.result() * 100), flush=True)
train_accuracy.reset_states()

if args.ckpt:
    saved = checkpoint.save(os.path.join(args.ckpt, "ckpt"))
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(args.ckpt, "managed"), max_to_keep=2)
    manager.save()
    manager.save()
    model.save_weights(os.path.join(args.ckpt, "weights", "w"))
    print("saved {} latest {}".format(saved, tf.train.latest_checkpoint(args.ckpt)), flush=True)

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
os.makedirs(args.out, exist_ok=True)
np.savez(os.path.join(args.out, "weights-{}-{}.npz".format(task["type"], task["index"])),
         *[v.numpy() for v in model.trainable_variables])
print("replicas {} steps {} sum|w| {:.6f}".format(strategy.num_replicas_in_sync, steps,
                                                  sum(float(np.abs(v.numpy()).sum()) for v in model.weights)),
      flush=True)
