"""TF's "Multi-worker training with Keras" tutorial's program (TF 2.4-2.15), on local data.

As tensorflow.org writes it: ``MultiWorkerMirroredStrategy`` reads TF_CONFIG
itself, the global batch is ``per worker * number of workers``, ``fit`` runs a
repeated dataset for ``steps_per_epoch``, and the model is saved by the chief
where the program says, by the others into a temporary directory they remove
(the tutorial's ``_is_chief`` / ``write_filepath``). ``--out DIR`` is where.

A test's knobs, not the tutorial's: ``--num-workers N``, the number of workers the global batch is made
for where TF_CONFIG names none (one process on the same global batches); ``--same-batches`` seeds the
initial values; each batch's ``logs`` (what Keras's progress bar prints mid-epoch) are printed as
``batch E.B loss L accuracy A``.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--num-workers", type=int, default=None)
p.add_argument("--same-batches", action="store_true")
args = p.parse_args()


def mnist_dataset(batch_size):
    rng = np.random.RandomState(0)       # the tutorial's MNIST download, replaced by local data
    x_train = rng.rand(512, 28, 28).astype("float32")
    y_train = (x_train.reshape(512, -1).mean(axis=1) > 0.5).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(512, seed=1).repeat().batch(batch_size)


def init(seed):
    return tf.keras.initializers.GlorotUniform(seed) if args.same_batches else "glorot_uniform"


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_initializer=init(1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu", kernel_initializer=init(2)),
        tf.keras.layers.Dense(10, kernel_initializer=init(3)),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


per_worker_batch_size = 32
tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config["cluster"]["worker"]) if tf_config else args.num_workers
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()


class PrintBatch(tf.keras.callbacks.Callback):          # the test's eyes on the progress bar's values
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        print("batch {}.{} loss {:.7f} accuracy {:.7f}".format(self.epoch, batch, logs["loss"], logs["accuracy"]),
              flush=True)


multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=5, verbose=2, callbacks=[PrintBatch()])


def _is_chief(task_type, task_id):
    return task_type == "worker" and task_id == 0


def write_filepath(filepath, task_type, task_id):
    dirpath, base = os.path.dirname(filepath), os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(dirpath)
    return os.path.join(dirpath, base)


task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
write_model_path = write_filepath(os.path.join(args.out, "keras-model"), task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
np.savez(os.path.join(args.out, "weights-{}-{}.npz".format(task_type, task_id)),
         *[v.numpy() for v in multi_worker_model.trainable_variables])
print("replicas {} saved {}".format(strategy.num_replicas_in_sync, write_model_path), flush=True)
