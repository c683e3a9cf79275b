"""A table split over as many parts as the cluster has ps tasks, checkpointed and restored with another count.

TF 1.x code as it was written for a fixed cluster: ``fixed_size_partitioner(num_ps)``, ``replica_device_setter``
and ``MonitoredTrainingSession(checkpoint_dir=...)``; in one process (no TF_CONFIG) the table is one part.
Prints ``RESTORED <json>`` (global step and predictions on a fixed batch as the session starts, from the
checkpoint if there is one), trains ``--steps`` more, and prints ``FINAL <json>`` (the same after the last
step, which the session's saver writes when it closes). Do not modernise: it is the TF 1.x code that TF1 mode
must run.
"""
import argparse
import json
import os
import sys

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--checkpoint_dir", required=True)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--partition_strategy", choices=["mod", "div"])
args = p.parse_args()
ROWS, DIM, COLUMNS = 30000, 8, 26

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
if tf_config:
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    server = tf.train.Server(cluster, job_name=job, task_index=index)
    if job == "ps":
        server.join()
        sys.exit(0)
    num_ps, target = len(tf_config["cluster"]["ps"]), server.target
    device_fn = tf.train.replica_device_setter(cluster=cluster, worker_device="/job:%s/task:%d" % (job, index))
else:
    num_ps, target, device_fn = 0, "", None

rng = np.random.RandomState(0)
probe = (rng.zipf(1.3, (32, COLUMNS)) - 1) % ROWS
with tf.device(device_fn):
    ids = tf.placeholder(tf.int64, [None, COLUMNS])
    labels = tf.placeholder(tf.float32, [None, 1])
    with tf.variable_scope("ctr", partitioner=tf.fixed_size_partitioner(max(num_ps, 1))):
        table = tf.get_variable("table", [ROWS, DIM], initializer=tf.random_uniform_initializer(-0.1, 0.1))
    # TF 1.x's default lookup, "mod" unless --partition_strategy says otherwise: id i is row i // num_parts of part
    # i % num_parts, so its row in the checkpoint moves with the count ("div": id i is row i, whatever the split).
    rows = tf.nn.embedding_lookup(table, ids, **({"partition_strategy": args.partition_strategy}
                                                 if args.partition_strategy else {}))
    hidden = tf.layers.dense(tf.reshape(rows, [-1, COLUMNS * DIM]), 16, tf.nn.relu)
    logits = tf.layers.dense(hidden, 1)
    predictions = tf.sigmoid(logits)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    global_step = tf.train.get_or_create_global_step()
    train_op = tf.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)

parts = 1 if isinstance(table, tf.Variable) else len(list(table))
with tf.train.MonitoredTrainingSession(master=target, is_chief=True, checkpoint_dir=args.checkpoint_dir,
                                       save_checkpoint_secs=None, save_checkpoint_steps=10 ** 6,
                                       save_summaries_steps=None) as sess:
    step, values = sess.run([global_step, predictions], {ids: probe})
    print("RESTORED " + json.dumps(dict(step=int(step), parts=parts, predictions=values.ravel().tolist())), flush=True)
    for _ in range(args.steps):
        x = (rng.zipf(1.3, (64, COLUMNS)) - 1) % ROWS
        y = (x[:, :1] % 3 == 0).astype(np.float32)
        sess.run(train_op, {ids: x, labels: y})
    step, values = sess.run([global_step, predictions], {ids: probe})
    print("FINAL " + json.dumps(dict(step=int(step), parts=parts, predictions=values.ravel().tolist())), flush=True)
