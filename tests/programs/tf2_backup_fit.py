"""TF's multi-worker Keras tutorial's fault-tolerant program (TF 2.4-2.15): ``fit`` with ``BackupAndRestore``.

As tensorflow.org's "Multi-worker training with Keras", section "Fault
tolerance", writes it: the model built in a ``MultiWorkerMirroredStrategy``
scope, ``fit`` with ``tf.keras.callbacks.BackupAndRestore(backup_dir=...)``, so
that a cluster restarted after a trainer's failure resumes at the epoch it was
in, not at the first. Local data (no download). Each epoch's start and end are
printed (``epoch N begins`` / ``epoch N ends``), and each batch's number and the
optimizer's step (``batch N of epoch E (step S)``); ``--batch-sleep S`` (a test's knob) makes each batch
last S seconds more, so a kill lands inside an epoch. ``--save-before-preemption`` is TF 2.11-2.15's
``BackupAndRestore(..., save_before_preemption=True)``: a SIGTERM saves at the step.
"""

import argparse
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--backup", required=True)
p.add_argument("--epochs", type=int, default=6)
p.add_argument("--batch-sleep", type=float, default=0.0)
p.add_argument("--save-before-preemption", action="store_true")
args = p.parse_args()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.RandomState(0)
x = rng.rand(320, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16 * strategy.num_replicas_in_sync)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.01))


class Epochs(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        print("epoch {} begins".format(epoch), flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print("epoch {} ends".format(epoch), flush=True)

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        print("batch {} of epoch {} (step {})".format(batch, self.epoch, step), flush=True)
        time.sleep(args.batch_sleep)


backup = (tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup, save_before_preemption=True)
          if args.save_before_preemption else tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup))
callbacks = [Epochs(), backup]      # a batch is printed before a save at a SIGTERM ends the trainer
model.fit(dataset, epochs=args.epochs, steps_per_epoch=10, verbose=0, callbacks=callbacks)
print("trained {} epochs".format(args.epochs), flush=True)
