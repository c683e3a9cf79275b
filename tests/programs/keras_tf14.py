"""A TF 1.14-era Keras program that builds and compiles its model in a strategy's scope: nothing about clusters.

    python keras_tf14.py [--strategy ps|multi_worker]

``ps``: ``tf.distribute.experimental.ParameterServerStrategy()``; ``multi_worker``:
``tf.distribute.experimental.MultiWorkerMirroredStrategy()``; both read TF_CONFIG. After fit it prints the
optimizer's update count on a line starting with ITER.
"""

import argparse

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--strategy", choices=("ps", "multi_worker"), default="ps")
args = p.parse_args()

strategy = tf.distribute.experimental.ParameterServerStrategy() if args.strategy == "ps" \
    else tf.distribute.experimental.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=tf.train.GradientDescentOptimizer(0.1))
x = np.random.RandomState(0).rand(64, 4).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
model.fit(x, y, epochs=2, batch_size=8, verbose=0)
print("ITER", tf.keras.backend.get_value(model.optimizer.iterations), flush=True)
