"""A TF 1.x-era Keras program that names a strategy for a cluster: nothing about clusters but the strategy.

    python keras_distribute.py [--form compile|scope|ps] [--batchnorm]

``compile``: TF 1.11-1.13's ``compile(distribute=tf.contrib.distribute.CollectiveAllReduceStrategy())`` with a
``tf.train`` optimizer; ``scope``: TF 1.14's ``with tf.distribute.experimental.MultiWorkerMirroredStrategy()
.scope():`` with Keras's ``'adam'``; ``ps``: ``compile(distribute=tf.contrib.distribute.ParameterServerStrategy())``
with a ``tf.train`` optimizer. All read TF_CONFIG. It fits 64 examples in order (``shuffle=False``), a
global batch of 8, 2 epochs; then prints the optimizer's update count (ITER) and the weights (WEIGHTS, json).
"""

import argparse
import json

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--form", choices=("compile", "scope", "ps"), default="compile")
p.add_argument("--batchnorm", action="store_true")
args = p.parse_args()


def build():
    # Seeded initialisers: a one-process run starts from the same weights, for the comparison.
    layers = [tf.keras.layers.Dense(8, activation="tanh", input_shape=(4,),
                                    kernel_initializer=tf.keras.initializers.glorot_uniform(seed=1))]
    if args.batchnorm:
        layers.append(tf.keras.layers.BatchNormalization())
    layers.append(tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.glorot_uniform(seed=2)))
    return tf.keras.Sequential(layers)


x = np.random.RandomState(0).rand(64, 4).astype(np.float32)
y = x @ np.array([[1.], [-2.], [0.5], [1.5]], np.float32) + 0.3
if args.form in ("compile", "ps"):
    model = build()
    model.compile(loss="mse", optimizer=tf.train.MomentumOptimizer(0.05, 0.9),
                  distribute=tf.contrib.distribute.CollectiveAllReduceStrategy() if args.form == "compile"
                  else tf.contrib.distribute.ParameterServerStrategy())
else:
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build()
        model.compile(loss="mse", optimizer="adam")
history = model.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
print("ITER", tf.keras.backend.get_value(model.optimizer.iterations), flush=True)
print("LOSS", json.dumps(history.history["loss"]), flush=True)
print("WEIGHTS", json.dumps([w.tolist() for w in model.get_weights()]), flush=True)
