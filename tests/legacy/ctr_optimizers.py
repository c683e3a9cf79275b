"""An embedding table on the ps trained by each of TF 1.x's sparse optimizers, as a TF 1.x script would.

The table (26 hashed columns in one table, ``fixed_size_partitioner``) is placed by
``replica_device_setter``, looked up with ``tf.nn.embedding_lookup`` and trained with
``MonitoredTrainingSession`` on ``server.target``; then the same graph, from the same seeds, is trained on
the same batches in one local session. Each optimizer prints one ``OPTIMIZER <json>`` line: the largest
difference between the two tables, the rows the batches touched, the bytes the ps received in a traced step
and the update ops the ps ran. Do not modernise: it is the TF 1.x code that TF1 mode must run.
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

from tfcluster.graph.traffic import step_traffic

ROWS, DIM, COLUMNS, BATCH, STEPS = 20000, 8, 26, 64, 12
OPTIMIZERS = {
    "sgd": lambda: tf.train.GradientDescentOptimizer(0.5),
    "momentum": lambda: tf.train.MomentumOptimizer(0.1, 0.9),
    "adagrad": lambda: tf.train.AdagradOptimizer(0.3),
    "ftrl": lambda: tf.train.FtrlOptimizer(0.3, l1_regularization_strength=0.001),
    "adam": lambda: tf.train.AdamOptimizer(0.01),
    "lazy_adam": lambda: tf.contrib.opt.LazyAdamOptimizer(0.01),
}

tf_config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(tf_config["cluster"])
job, index = tf_config["task"]["type"], tf_config["task"]["index"]
server = tf.train.Server(cluster, job_name=job, task_index=index)
if job == "ps":
    server.join()
    sys.exit(0)

rng = np.random.RandomState(0)
batches = [((rng.zipf(1.3, (BATCH, COLUMNS)) - 1) % ROWS, rng.randint(0, 2, (BATCH, 1)).astype(np.float32))
           for _ in range(STEPS)]


def model(name, device_fn):
    with tf.device(device_fn):
        ids = tf.placeholder(tf.int64, [None, COLUMNS])
        labels = tf.placeholder(tf.float32, [None, 1])
        with tf.variable_scope(name, partitioner=tf.fixed_size_partitioner(2)):
            table = tf.get_variable("table", [ROWS, DIM], initializer=tf.random_uniform_initializer(-0.1, 0.1, seed=1))
        logits = 4 * tf.reduce_mean(tf.nn.embedding_lookup(table, ids), [1, 2])[:, None]
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        global_step = tf.train.get_or_create_global_step()
        train_op = OPTIMIZERS[name]().minimize(loss, global_step=global_step)
    return ids, labels, train_op, table


def train(name, on_cluster):
    graph = tf.Graph()
    with graph.as_default():
        tf.set_random_seed(0)
        device_fn = tf.train.replica_device_setter(cluster=cluster, worker_device="/job:worker/task:0") \
            if on_cluster else None
        ids, labels, train_op, table = model(name, device_fn)
        whole = tf.concat(list(table), 0) if isinstance(table, (list, tuple)) else tf.convert_to_tensor(table)
        traced = {}
        target = server.target if on_cluster else ""
        with tf.train.MonitoredTrainingSession(master=target, is_chief=True) as sess:
            start = sess.run(whole)
            for step, (x, y) in enumerate(batches):
                if on_cluster and step == STEPS // 2:
                    options = tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE)
                    metadata = tf.RunMetadata()
                    sess.run(train_op, {ids: x, labels: y}, options=options, run_metadata=metadata)
                    traced["to_ps"] = step_traffic(metadata).received_by("ps")
                    traced["ps_ops"] = sorted({n.timeline_label.split("= ")[1].split("(")[0]
                                               for d in metadata.step_stats.dev_stats if "/job:ps" in d.device
                                               for n in d.node_stats if "= " in n.timeline_label
                                               and ("Apply" in n.timeline_label or "Scatter" in n.timeline_label)})
                    traced["distinct"] = len(np.unique(x))
                else:
                    sess.run(train_op, {ids: x, labels: y})
            return start, sess.run(whole), traced


ids_used = np.unique(np.concatenate([x.ravel() for x, _ in batches]))
# embedding_lookup's default "mod" strategy keeps id i in part i % 2, row i // 2 of it.
touched = (ids_used % 2) * (ROWS // 2) + ids_used // 2
untouched = np.setdiff1d(np.arange(ROWS), touched)
for name in OPTIMIZERS:
    start, on_ps, traced = train(name, True)
    _, alone, _ = train(name, False)
    print("OPTIMIZER " + json.dumps(dict(
        name=name, max_difference=float(np.abs(on_ps - alone).max()),
        touched_moved=float(np.abs(on_ps - start)[touched].max(axis=1).min()),
        largest_move=float(np.abs(on_ps - start).max()),
        untouched_moved=float(np.abs(on_ps - start)[untouched].max()), touched_rows=int(len(touched)),
        **traced)), flush=True)
