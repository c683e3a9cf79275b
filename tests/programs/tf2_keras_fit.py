"""The TF 2 "Distributed training with Keras" tutorial's program, as TF 2.0-2.15 wrote it, on local data.

tensorflow.org's tutorial: a ``MirroredStrategy``, the model built and compiled
in its scope (a ``Sequential`` without an input shape), ``fit`` on numpy
arrays with the global batch ``per replica * num_replicas_in_sync``. Its data
are generated (no download); the model is the tutorial's shape, smaller.

``--out DIR`` writes the trained weights to ``DIR/weights-<task>.npz``. A test's knobs, not the
tutorial's: ``--logical-cpus N`` splits this process's CPU into N devices and mirrors over them, as one
machine with N GPUs would; ``--same-batches`` seeds the initial values and fits without shuffling, so one
process and a cluster step on the same global batches from the same start.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--logical-cpus", type=int, default=1)
p.add_argument("--same-batches", action="store_true")
args = p.parse_args()

if args.logical_cpus > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.logical_cpus)

rng = np.random.RandomState(0)
x = rng.rand(256, 8, 8, 1).astype("float32")
y = (x.reshape(256, -1).sum(axis=1) > 32).astype("int64")

devices = [f"/cpu:{i}" for i in range(args.logical_cpus)] if args.logical_cpus > 1 else None
strategy = tf.distribute.MirroredStrategy(devices)
keras_version = getattr(tf.keras, "__version__", None) or "2 (tf-keras)"      # tf-keras's tf.keras has none
print("Number of devices: {} (Keras {})".format(strategy.num_replicas_in_sync, keras_version), flush=True)
BATCH_SIZE = 16 * strategy.num_replicas_in_sync



def init(seed):
    return tf.keras.initializers.GlorotUniform(seed) if args.same_batches else "glorot_uniform"


with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, 3, activation="relu", kernel_initializer=init(1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init(2)),
        tf.keras.layers.Dense(2, kernel_initializer=init(3)),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])

model.fit(x, y, batch_size=BATCH_SIZE, epochs=args.epochs, verbose=2, shuffle=not args.same_batches)

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
os.makedirs(args.out, exist_ok=True)
np.savez(os.path.join(args.out, "weights-{}-{}.npz".format(task["type"], task["index"])),
         *[v.numpy() for v in model.trainable_variables])
print("replicas {} sum|w| {:.6f}".format(strategy.num_replicas_in_sync,
                                         sum(float(np.abs(v.numpy()).sum()) for v in model.weights)), flush=True)
