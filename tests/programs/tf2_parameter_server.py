"""TF's "Parameter server training with ParameterServerStrategy" tutorial's program (TF 2.4-2.15), on local data.

As tensorflow.org writes it for a real cluster: every task reads TF_CONFIG; a
worker or ps starts a ``tf.distribute.Server`` and ``server.join()``\\ s (for
ever, in TF); the chief builds a ``ParameterServerStrategy`` and trains, here
with a ``ClusterCoordinator`` custom loop (``--fit``: Keras ``fit`` with a
``DatasetCreator``). ``--out DIR`` writes the chief's trained weights and step.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--fit", action="store_true")
args = p.parse_args()

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type in ("worker", "ps"):
    os.environ["GRPC_FAIL_FAST"] = "use_caller"
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=cluster_resolver.task_type,
                                  task_index=cluster_resolver.task_id, protocol=cluster_resolver.rpc_layer or "grpc",
                                  start=True)
    server.join()
    raise SystemExit(0)

variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=cluster_resolver.cluster_spec().num_tasks("ps"))
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

rng = np.random.RandomState(0)
x = rng.rand(256, 8).astype("float32")
y = (x.sum(axis=1) > 4).astype("int64")
global_batch_size = 32


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu", input_shape=(8,)),
                                 tf.keras.layers.Dense(2)])

if args.fit:
    with strategy.scope():
        model.compile(tf.keras.optimizers.SGD(learning_rate=0.1),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), steps_per_execution=4)
    model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=8, verbose=2)
    step = int(model.optimizer.iterations.numpy())
else:
    with strategy.scope():
        optimizer = tf.keras.optimizers.legacy.RMSprop(learning_rate=0.1)
        accuracy = tf.keras.metrics.Accuracy()

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    @tf.function
    def step_fn(iterator):
        def replica_fn(batch_data, labels):
            with tf.GradientTape() as tape:
                pred = model(batch_data, training=True)
                per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True, reduction=tf.keras.losses.Reduction.NONE)(labels, pred)
                loss = tf.nn.compute_average_loss(per_example_loss)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            accuracy.update_state(labels, tf.argmax(pred, axis=1, output_type=tf.int64))
            return loss

        batch_data, labels = next(iterator)
        losses = strategy.run(replica_fn, args=(batch_data, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iterator = iter(per_worker_dataset)
    for epoch in range(2):
        accuracy.reset_states()
        for _ in range(8):
            coordinator.schedule(step_fn, args=(per_worker_iterator,))
        coordinator.join()
        print("Finished epoch %d, accuracy is %f." % (epoch, accuracy.result().numpy()), flush=True)
    step = int(optimizer.iterations.numpy())

os.makedirs(args.out, exist_ok=True)
task = json.loads(os.environ["TF_CONFIG"])["task"]
np.savez(os.path.join(args.out, "weights-{}-{}.npz".format(task["type"], task["index"])),
         *[v.numpy() for v in model.trainable_variables])
print("chief done: step {}".format(step), flush=True)
