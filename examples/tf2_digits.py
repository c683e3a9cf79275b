"""The TF 2 tutorials' programs on handwritten digits: a MirroredStrategy, as ``fit`` or as a custom loop.

    python -m tfcluster.tf2 examples/tf2_digits.py                                 # one process, as on TF 2.x
    tfcluster local --tf2 --ps 0 --workers 2 -- python examples/tf2_digits.py        # one model over 2 workers
    tfcluster local --tf2 --ps 0 --workers 2 -- python examples/tf2_digits.py --loop custom
    tfcluster local --tf2 --ps 0 --workers 2 --max-restarts 1 -- python examples/tf2_digits.py --backup /tmp/b

Written as TF 2.0-2.3's tensorflow.org tutorials wrote them ("Distributed
training with Keras", "Custom training with tf.distribute.Strategy"), so it
runs on TF 2.21 only through TF2 mode (or TensorFlow 2.0-2.3 itself):
``tf.distribute.MirroredStrategy()``, the global batch as per-replica batch x
``num_replicas_in_sync``, ``strategy.experimental_run_v2`` (TF 2.4 removed it),
the loss averaged over the global batch, ``reset_states()``. Under ``tfcluster
local --tf2`` the strategy is the cluster's: each worker's devices are its
replicas and gradients are all-reduced (docs/tf2.md). ``--backup DIR`` adds
Keras's ``BackupAndRestore`` to ``fit``, so a restarted cluster resumes at the
epoch it was in. The data are the UCI digits that ship inside scikit-learn
(8x8 images): nothing is downloaded. The chief prints the test accuracy.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--loop", choices=("fit", "custom"), default="fit", help="Keras fit (default) or a custom loop")
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--backup", help="BackupAndRestore's directory (fit): a restarted run resumes at its epoch")
args = p.parse_args()

digits = load_digits()
images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
labels = digits.target.astype("int64")
order = np.random.RandomState(0).permutation(len(labels))      # writers mixed over both parts
train, test = order[:1500], order[1500:]
train_images, test_images, train_labels, test_labels = images[train], images[test], labels[train], labels[test]

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

BATCH_SIZE_PER_REPLICA = 32
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(1500, seed=0)
train_dataset = train_dataset.repeat().batch(GLOBAL_BATCH_SIZE)
STEPS_PER_EPOCH = len(train_images) // GLOBAL_BATCH_SIZE

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, 3, activation="relu", padding="same", input_shape=(8, 8, 1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10)])
    optimizer = tf.keras.optimizers.Adam()

if args.loop == "fit":
    with strategy.scope():
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=optimizer,
                      metrics=["accuracy"])
    callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup)] if args.backup else []
    model.fit(train_dataset, epochs=args.epochs, steps_per_epoch=STEPS_PER_EPOCH, callbacks=callbacks, verbose=2)
else:
    with strategy.scope():
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                    reduction=tf.keras.losses.Reduction.NONE)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    def train_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            loss = tf.nn.compute_average_loss(loss_object(y, predictions), global_batch_size=GLOBAL_BATCH_SIZE)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return loss

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.experimental_run_v2(train_step, args=(dataset_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    batches = iter(strategy.experimental_distribute_dataset(train_dataset))
    for epoch in range(args.epochs):
        total_loss = sum(float(distributed_train_step(next(batches))) for _ in range(STEPS_PER_EPOCH))
        print("Epoch {}, Loss: {:.4f}, Accuracy: {:.2f}".format(epoch + 1, total_loss / STEPS_PER_EPOCH,
                                                                float(train_accuracy.result()) * 100))
        train_accuracy.reset_states()

# The model's own copy on this worker (every worker holds the same weights): no collective, so the chief alone asks.
tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
task, cluster = tf_config.get("task", {}), tf_config.get("cluster", {})
if not task or task["type"] == "chief" or (task["type"] == "worker" and task["index"] == 0 and "chief" not in cluster):
    predictions = np.argmax(model(test_images, training=False).numpy(), axis=1)
    print("test accuracy: {:.4f}".format(float(np.mean(predictions == test_labels))), flush=True)
