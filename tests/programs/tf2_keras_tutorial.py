"""TF's "Distributed training with Keras" tutorial (TF 2.0-2.15), as it writes its program, on local data.

tensorflow/docs ``site/en/tutorials/distribute/keras.ipynb``: the datasets are
made **before** the strategy (``tfds.load``; here generated arrays in a
``tf.data`` pipeline), then a ``MirroredStrategy``, the model built and compiled
in its scope, ``fit`` with the tutorial's callbacks (``TensorBoard``,
``ModelCheckpoint`` of the weights each epoch, ``LearningRateScheduler``, a
callback printing the learning rate), the latest checkpoint loaded and
evaluated, and the model saved as a SavedModel (``model.save(path,
save_format="tf")``) on every worker and loaded back without the strategy and in
its scope; the TF 2 save-and-load guide's ``tf.saved_model.save`` too.

A test's knobs, not the tutorial's: ``--out DIR`` holds what the tutorial writes
and ``weights-<task>.npz`` / ``predictions-<task>.npy`` (the trained model on the
evaluation images); ``--logical-cpus N`` splits this process's CPU in N devices
and mirrors over them, as one machine with N GPUs would; ``--same-batches``
seeds the initial values and leaves out the shuffle, so one process and a
cluster step on the same global batches from the same start; each batch's
``logs`` (what Keras's progress bar prints mid-epoch) are printed as
``batch E.B loss L accuracy A``.
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

# The tutorial's tfds.load("mnist", as_supervised=True), replaced by local data: made before the strategy.
rng = np.random.RandomState(0)
images = rng.randint(0, 256, (384, 28, 28, 1)).astype("uint8")
labels = (images[:, :14].mean(axis=(1, 2, 3)) > images[:, 14:].mean(axis=(1, 2, 3))).astype("int64")
mnist_train = tf.data.Dataset.from_tensor_slices((images[:256], labels[:256]))
mnist_test = tf.data.Dataset.from_tensor_slices((images[256:], labels[256:]))

devices = [f"/cpu:{i}" for i in range(args.logical_cpus)] if args.logical_cpus > 1 else None
strategy = tf.distribute.MirroredStrategy(devices)
print("Number of devices: {}".format(strategy.num_replicas_in_sync), flush=True)

BUFFER_SIZE = 10000
BATCH_SIZE_PER_REPLICA = 16
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync


def scale(image, label):
    image = tf.cast(image, tf.float32)
    image /= 255
    return image, label


train_dataset = mnist_train.map(scale).cache()
if not args.same_batches:
    train_dataset = train_dataset.shuffle(BUFFER_SIZE)
train_dataset = train_dataset.batch(BATCH_SIZE)
eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)


def init(seed):
    return tf.keras.initializers.GlorotUniform(seed) if args.same_batches else "glorot_uniform"


with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1), kernel_initializer=init(1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init(2)),
        tf.keras.layers.Dense(10, kernel_initializer=init(3)),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])

checkpoint_dir = os.path.join(args.out, "training_checkpoints")
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch}")


def decay(epoch):
    if epoch < 3:
        return 1e-3
    elif epoch >= 3 and epoch < 7:
        return 1e-4
    else:
        return 1e-5


class PrintLR(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print("\nLearning rate for epoch {} is {}".format(epoch + 1, model.optimizer.lr.numpy()), flush=True)


class PrintBatch(tf.keras.callbacks.Callback):          # the test's eyes on the progress bar's values
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        print("batch {}.{} loss {:.7f} accuracy {:.7f}".format(self.epoch, batch, logs["loss"], logs["accuracy"]),
              flush=True)


callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir=os.path.join(args.out, "logs")),
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
    PrintLR(),
    PrintBatch(),
]

model.fit(train_dataset, epochs=args.epochs, callbacks=callbacks, verbose=0)

model.load_weights(tf.train.latest_checkpoint(checkpoint_dir))
eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=0)
print("Eval loss: {:.6f}, Eval Accuracy: {:.6f}".format(eval_loss, eval_acc), flush=True)

path = os.path.join(args.out, "saved_model/")
model.save(path, save_format="tf")

unreplicated_model = tf.keras.models.load_model(path)
unreplicated_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])
eval_loss, eval_acc = unreplicated_model.evaluate(eval_dataset, verbose=0)
print("Unreplicated eval loss: {:.6f}, Eval Accuracy: {:.6f}".format(eval_loss, eval_acc), flush=True)

with strategy.scope():
    replicated_model = tf.keras.models.load_model(path)
    replicated_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                             optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])
    eval_loss, eval_acc = replicated_model.evaluate(eval_dataset, verbose=0)
    print("Replicated eval loss: {:.6f}, Eval Accuracy: {:.6f}".format(eval_loss, eval_acc), flush=True)

tf.saved_model.save(model, os.path.join(args.out, "exported"))        # TF's save-and-load guide's export

task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
name = "{}-{}".format(task["type"], task["index"])
np.savez(os.path.join(args.out, "weights-{}.npz".format(name)), *[v.numpy() for v in model.trainable_variables])
np.save(os.path.join(args.out, "predictions-{}.npy".format(name)), model.predict(images[256:] / 255.0, verbose=0))
print("trained and saved", flush=True)
