"""TF's "Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial (2021-TF 2.15), on local data.

tensorflow/docs ``site/en/tutorials/distribute/multi_worker_with_ctl.ipynb`` as it
writes its program: ``MultiWorkerMirroredStrategy`` from TF_CONFIG, the dataset
from ``distribute_datasets_from_function`` (each input pipeline its shard, the
per-replica batch from the ``InputContext``), a ``tf.function`` step with
``strategy.run``, the loss scaled by the global batch, and a ``CheckpointManager``
in a write directory of the task's own: the chief's where the program says, a
non-chief's in ``workertemp_<id>``, which the non-chief removes after each save
(the tutorial's ``write_filepath`` and ``tf.io.gfile.rmtree``). It restores the
chief's latest checkpoint at its start.

A test's knobs, not the tutorial's: ``--out DIR`` for the checkpoints (the tutorial's
``multiprocessing.util.get_temp_dir()``, private to each machine) and
``weights-<task>.npz``; ``--num-workers N``, the number of workers the global batch
is made for where TF_CONFIG names none (one process on the same global batches);
``--same-batches`` seeds the initial values and leaves out the shuffle.
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


def mnist_dataset():
    rng = np.random.RandomState(0)       # the tutorial's MNIST download, replaced by local data
    x_train = rng.rand(1024, 28, 28).astype("float32")
    y_train = (x_train[:, :14].mean(axis=(1, 2)) > x_train[:, 14:].mean(axis=(1, 2))).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    if not args.same_batches:
        dataset = dataset.shuffle(1024)
    return dataset.repeat()


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def init(seed):
    return tf.keras.initializers.GlorotUniform(seed) if args.same_batches else "glorot_uniform"


def build_cnn_model():
    return tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_initializer=init(1)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu", kernel_initializer=init(2)),
        tf.keras.layers.Dense(10, kernel_initializer=init(3)),
    ])


tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
per_worker_batch_size = 32
num_workers = len(tf_config["cluster"]["worker"]) if tf_config else args.num_workers
global_batch_size = per_worker_batch_size * num_workers
num_epochs = 3
num_steps_per_epoch = 6

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    multi_worker_model = build_cnn_model()
    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: dataset_fn(global_batch_size, input_context))
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    """Training step function."""

    def step_fn(inputs):
        """Per-Replica step function."""
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_batch_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
            loss = tf.nn.compute_average_loss(per_batch_loss, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


checkpoint_dir = os.path.join(args.out, "ckpt")


def _is_chief(task_type, task_id, cluster_spec):
    return (task_type is None or task_type == "chief" or
            (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")
task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
cluster_spec = strategy.cluster_resolver.cluster_spec()

checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)

while epoch.numpy() < num_epochs:
    iterator = iter(multi_worker_dataset)
    total_loss = 0.0
    num_batches = 0

    while step_in_epoch.numpy() < num_steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)

    train_loss = total_loss / num_batches
    print("Epoch: %d, accuracy: %f, train_loss: %f." % (epoch.numpy(), train_accuracy.result(), train_loss),
          flush=True)

    train_accuracy.reset_states()

    checkpoint_manager.save()
    if not _is_chief(task_type, task_id, cluster_spec):
        tf.io.gfile.rmtree(write_checkpoint_dir)

    epoch.assign_add(1)
    step_in_epoch.assign(0)

name = "{}-{}".format(task_type or "local", task_id or 0)
np.savez(os.path.join(args.out, "weights-{}.npz".format(name)), *[v.numpy() for v in multi_worker_model.trainable_variables])
print("replicas {} saved {}".format(strategy.num_replicas_in_sync, write_checkpoint_dir), flush=True)
