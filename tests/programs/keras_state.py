"""A TF 1.x-era Keras program that reads its model's state after fit: nothing about clusters.

    python keras_state.py [--epochs N] [--deferred] [--dataset] [--sample-weight] [--step-sleep S] [--tf-optimizer]

Its optimizer's learning rate decays with the update count (a tf.keras schedule). A callback prints the
update count the optimizer sees at each epoch's end; after fit it prints, as JSON on a line starting with
STATE, the count ``get_value(model.optimizer.iterations)`` reads, the decayed learning rate, and a digest of
the weights. ``--deferred``: a Sequential without input_shape (built when fit sees the data); ``--dataset``:
fit on a tf.data.Dataset; ``--sample-weight``: with sample weights; ``--step-sleep``: each batch sleeps this
long (a callback), so faults can be timed; ``--tf-optimizer``: a tf.train optimizer, as TF 1.11's tutorial
compiled it.
"""

import argparse
import json
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--deferred", action="store_true")
p.add_argument("--dataset", action="store_true")
p.add_argument("--sample-weight", action="store_true")
p.add_argument("--tf-optimizer", action="store_true")
p.add_argument("--step-sleep", type=float, default=0.0)
args = p.parse_args()

rng = np.random.RandomState(0)
x = rng.rand(256, 6).astype(np.float32)
y = (x.sum(axis=1) > 3).astype(np.int64)

first = [tf.keras.layers.Dense(16, activation="relu")] if args.deferred else \
    [tf.keras.layers.Dense(16, activation="relu", input_shape=(6,))]
model = tf.keras.Sequential(first + [tf.keras.layers.Dense(2, activation="softmax")])
schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
optimizer = tf.train.GradientDescentOptimizer(0.1) if args.tf_optimizer else tf.keras.optimizers.SGD(schedule)
model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])


class Updates(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(args.step_sleep)

    def on_epoch_end(self, epoch, logs=None):
        print("EPOCH_END", epoch, int(tf.keras.backend.get_value(self.model.optimizer.iterations)), flush=True)


kwargs = dict(epochs=args.epochs, verbose=0, callbacks=[Updates()])
if args.dataset:
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
    model.fit(data, steps_per_epoch=8, **kwargs)
else:
    model.fit(x, y, batch_size=16, sample_weight=np.ones(len(x)) if args.sample_weight else None, **kwargs)

iterations = int(tf.keras.backend.get_value(model.optimizer.iterations))
lr = None if args.tf_optimizer else float(tf.keras.backend.get_value(schedule(model.optimizer.iterations)))
digest = float(sum(np.abs(w).sum() for w in model.get_weights()))
print("STATE " + json.dumps({"iterations": iterations, "lr": lr, "digest": digest,
                             "accuracy": float(model.evaluate(x, y, verbose=0)[1])}), flush=True)
