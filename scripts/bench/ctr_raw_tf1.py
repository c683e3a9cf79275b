"""Peer: the click-through model as a TF1 user wrote it by hand for parameter servers.

The four classic flags, ``replica_device_setter``, each table split over the ps by
``fixed_size_partitioner``, ``embedding_lookup_sparse`` (TF 1.x's default "mod"
strategy), Adagrad, ``MonitoredTrainingSession``. The same wide & deep as
scripts/bench/ctr.py (examples/click_through_fit.py's model): 26 hashed columns,
16-float rows concatenated for a DNN 256-128, one wide weight per hashed value,
batch 512 per worker, the same TFRecord shards. The ps calls server.join() and
never exits, as in the tutorials.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import tensorflow as tf  # noqa: E402

import clicklog  # noqa: E402
from common import Meter, four_flags, report  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
COLUMNS, DIMENSION = len(clicklog.CATEGORICAL), 16

p = four_flags(argparse.ArgumentParser())
p.add_argument("--buckets", type=int, default=100_000)
p.add_argument("--batch", type=int, default=512)
p.add_argument("--steps", type=int, default=600, help="global steps")
p.add_argument("--examples", type=int, default=100_000)
p.add_argument("--data_dir", required=True)
a = p.parse_args()

ps_hosts, worker_hosts = a.ps_hosts.split(","), a.worker_hosts.split(",")
cluster = tf1.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
server = tf1.train.Server(cluster, job_name=a.job_name, task_index=a.task_index)
if a.job_name == "ps":
    server.join()


def batches():
    path = clicklog.write_train(a.data_dir, a.task_index, len(worker_hosts), a.examples)
    records = tf.data.TFRecordDataset([path]).shuffle(20000, seed=a.task_index).repeat()
    records = records.batch(a.batch, drop_remainder=True).prefetch(2)
    features = tf.io.parse_example(tf1.data.make_one_shot_iterator(records).get_next(), clicklog.feature_spec())
    return features, features.pop("clicked")


def dense(x, units, name, activation=None):
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [x.shape[-1], units], initializer=tf1.glorot_uniform_initializer(seed=2))
        y = tf.matmul(x, w) + tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        return activation(y) if activation else y


with tf1.device(tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{a.task_index}", cluster=cluster)):
    features, labels = batches()
    strings = tf.concat([features[name] for name in clicklog.CATEGORICAL], axis=1)
    ids = tf.strings.to_hash_bucket_fast(strings, a.buckets) + tf.constant(
        [i * a.buckets for i in range(COLUMNS)], tf.int64)
    flat = tf.reshape(ids, [-1])
    n = tf.size(flat, out_type=tf.int64)
    # One id per (example, column) row for the deep part; 26 ids per example for the wide part.
    per_column = tf.SparseTensor(tf.stack([tf.range(n), tf.zeros([n], tf.int64)], 1), flat, [n, 1])
    per_example = tf.SparseTensor(tf.stack([tf.range(n) // COLUMNS, tf.range(n) % COLUMNS], 1), flat,
                                  [a.batch, COLUMNS])
    split = tf1.fixed_size_partitioner(len(ps_hosts))
    table = tf1.get_variable("embeddings", [COLUMNS * a.buckets, DIMENSION], partitioner=split,
                             initializer=tf1.truncated_normal_initializer(stddev=0.05, seed=1))
    wide_table = tf1.get_variable("wide", [COLUMNS * a.buckets, 1], partitioner=split,
                                  initializer=tf1.zeros_initializer())
    deep_rows = tf.nn.embedding_lookup_sparse(table, per_column, None, combiner="sum")
    numeric = tf.concat([features[name] for name in clicklog.NUMERIC], axis=1)
    h = tf.concat([numeric, tf.reshape(deep_rows, [-1, COLUMNS * DIMENSION])], 1)
    for i, units in enumerate((256, 128)):
        h = dense(h, units, f"dnn_{i}", tf.nn.relu)
    wide = tf.nn.embedding_lookup_sparse(wide_table, per_example, None, combiner="sum")
    logits = tf.squeeze(dense(h, 1, "dnn_logit") + wide, 1)
    clicked = tf.cast(tf.squeeze(labels, 1), tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=clicked, logits=logits))
    global_step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.AdagradOptimizer(0.05).minimize(loss, global_step=global_step)

meter = Meter(a.batch)
started = time.time()
# Without device filters a non-chief that starts after the chief has finished waits for it forever.
config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{a.task_index}"])
with tf1.train.MonitoredTrainingSession(master=server.target, is_chief=a.task_index == 0, config=config,
                                       hooks=[tf1.train.StopAtStepHook(last_step=a.steps)]) as sess:
    while not sess.should_stop():
        sess.run(train_op)
        meter.step()
report(meter.result(peer="ctr_raw_tf1", task=a.task_index, started=started))
