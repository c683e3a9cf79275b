"""Peer: the click-through model on TF2 ParameterServerStrategy, Keras Embedding layers on ShardedVariables.

TF_CONFIG names a chief (the coordinator), 2 workers and the ps; workers and
ps only serve. The same wide & deep as scripts/bench/ctr.py: 26 hashed
columns in one table of 16-float rows and one of wide weights, each a
``tf_keras.layers.Embedding`` built under the strategy's scope with a
``FixedShardsPartitioner`` (one shard per ps, so a ShardedVariable), a DNN
256-128, Adagrad 0.05, batch 512 per worker over the same TFRecord shards.
Keras 3 (TF 2.21's ``tf.keras``) does not run under ParameterServerStrategy;
tf-keras does. As TF's tutorial writes it at its best: a tf.function step
per ``schedule``, every step scheduled at once, one ``join()``.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import clicklog  # noqa: E402
from common import pss_role, pss_timed  # noqa: E402

batch = int(os.environ.get("BENCH_BATCH", "512"))
steps = int(os.environ.get("BENCH_STEPS", "600"))
buckets = int(os.environ.get("BENCH_BUCKETS", "100000"))
data_dir = os.environ["BENCH_DATA_DIR"]
COLUMNS = len(clicklog.CATEGORICAL)
resolver = pss_role(tf)

num_ps = len(resolver.cluster_spec().as_dict()["ps"])
workers = len(resolver.cluster_spec().as_dict()["worker"])
strategy = tf.distribute.ParameterServerStrategy(
    resolver, variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(num_ps))
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
shards = [clicklog.write_train(data_dir, i, workers, 100_000) for i in range(workers)]
offsets = tf.constant([i * buckets for i in range(COLUMNS)], tf.int64)

with strategy.scope():
    embed = tf_keras.layers.Embedding(COLUMNS * buckets, 16, embeddings_initializer=tf_keras.initializers.TruncatedNormal(
        stddev=0.05, seed=1))
    wide = tf_keras.layers.Embedding(COLUMNS * buckets, 1, embeddings_initializer="zeros")
    dnn = tf_keras.Sequential([tf_keras.layers.Dense(256, activation="relu"),
                               tf_keras.layers.Dense(128, activation="relu"), tf_keras.layers.Dense(1)])
    dnn.build([None, len(clicklog.NUMERIC) + COLUMNS * 16])
    embed.build([None, COLUMNS])
    wide.build([None, COLUMNS])
    bias = tf.Variable(tf.zeros([1]))
    optimizer = tf_keras.optimizers.legacy.Adagrad(0.05)


def dataset_fn():
    def parse(records):
        f = tf.io.parse_example(records, clicklog.feature_spec())
        strings = tf.concat([f[name] for name in clicklog.CATEGORICAL], axis=1)
        numeric = tf.concat([f[name] for name in clicklog.NUMERIC], axis=1)
        return numeric, tf.strings.to_hash_bucket_fast(strings, buckets) + offsets, tf.cast(f["clicked"], tf.float32)
    records = tf.data.TFRecordDataset(shards).shuffle(20000).repeat()
    return records.batch(batch, drop_remainder=True).map(parse).prefetch(2)


per_worker_iter = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def step(iterator):
    def replica_fn(numeric, ids, clicked):
        with tf.GradientTape() as tape:
            h = tf.concat([numeric, tf.reshape(embed(ids), [-1, COLUMNS * 16])], 1)
            logits = dnn(h) + tf.reduce_sum(wide(ids), axis=1) + bias
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=clicked, logits=logits))
        params = embed.trainable_variables + wide.trainable_variables + dnn.trainable_variables + [bias]
        optimizer.apply_gradients(zip(tape.gradient(loss, params), params))
        return loss
    return strategy.run(replica_fn, args=next(iterator))



pss_timed(coordinator, step, per_worker_iter, steps, batch, peer="ctr_tf2_pss",
          table=f"{type(embed.embeddings).__name__} of {len(getattr(embed.embeddings, 'variables', [0]))}")
