"""Wide & deep as DeepRec's model zoo writes it: embedding variables through feature columns, Adagrad and Ftrl.

The deep part's 26 categorical columns are DeepRec's ``categorical_column_with_embedding`` (a row per value,
admitted once seen twice, evicted at a save once untouched for 100 steps) under ``embedding_column``; the wide
part hashes the same columns into ``linear_model`` weights. The DNN trains with Adagrad, the linear part with Ftrl,
each optimizer on its scope's variables; ``replica_device_setter`` and ``MonitoredTrainingSession`` as TF 1.x
programs had them. Reads the click log scripts/clicklog.py writes. Prints ``FINAL <json>`` (the global step and
the loss on a fixed batch of the eval file) on the chief. Do not modernise: it is the DeepRec code that TF1 mode
must run.
"""
import argparse
import json
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
import clicklog  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--checkpoint_dir", required=True)
p.add_argument("--data_dir", required=True)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--incremental_ckpt", type=int, default=None)
args = p.parse_args()

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
if tf_config:
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    job, index = tf_config["task"]["type"], tf_config["task"]["index"]
    server = tf.train.Server(cluster, job_name=job, task_index=index)
    if job == "ps":
        server.join()
        sys.exit(0)
    workers, target = len(tf_config["cluster"]["worker"]), server.target
    device_fn = tf.train.replica_device_setter(cluster=cluster, worker_device="/job:%s/task:%d" % (job, index))
else:
    job, index, workers, target, device_fn = "worker", 0, 1, "", None

ev_option = tf.EmbeddingVariableOption(filter_option=tf.CounterFilter(filter_freq=2),
                                       evict_option=tf.GlobalStepEvict(steps_to_live=100))
deep = [tf.feature_column.embedding_column(
            tf.feature_column.categorical_column_with_embedding(name, dtype=tf.string, ev_option=ev_option),
            dimension=8, combiner="mean") for name in clicklog.CATEGORICAL]
deep += [tf.feature_column.numeric_column(name) for name in clicklog.NUMERIC]
wide = [tf.feature_column.categorical_column_with_hash_bucket(name, 1000) for name in clicklog.CATEGORICAL]


def parse(records):
    features = tf.io.parse_example(records, clicklog.feature_spec())
    return features, features.pop("clicked")


def model(features):
    with tf.variable_scope("dnn"):
        h = tf.feature_column.input_layer(features, deep)
        for units in (64, 32):
            h = tf.layers.dense(h, units, tf.nn.relu)
        dnn_logits = tf.layers.dense(h, 1)
    with tf.variable_scope("linear"):
        linear_logits = tf.feature_column.linear_model(features, wide)
    return dnn_logits + linear_logits


train_file = clicklog.write_train(args.data_dir, index, workers, 20000)
eval_file = clicklog.write_eval(args.data_dir, 2000)
with tf.device(device_fn):
    dataset = tf.data.TFRecordDataset([train_file]).repeat().batch(256).map(parse)
    features, clicked = tf.data.make_one_shot_iterator(dataset).get_next()
    with tf.variable_scope("model"):
        logits = model(features)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(clicked, tf.float32),
                                                                  logits=logits))
    eval_features, eval_clicked = parse(tf.data.TFRecordDataset([eval_file]).batch(2000).make_one_shot_iterator()
                                        .get_next())
    with tf.variable_scope("model", reuse=True):
        eval_logits = model(eval_features)
    eval_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(eval_clicked, tf.float32),
                                                                       logits=eval_logits))
    global_step = tf.train.get_or_create_global_step()
    dnn_vars = tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES, scope="model/dnn")
    linear_vars = tf.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES, scope="model/linear")
    train_op = tf.group(tf.train.AdagradOptimizer(0.05).minimize(loss, var_list=dnn_vars),
                        tf.train.FtrlOptimizer(0.05).minimize(loss, var_list=linear_vars, global_step=global_step))

class FinalLoss(tf.train.SessionRunHook):
    def end(self, session):
        step, value = session.run([global_step, eval_loss])
        print("FINAL " + json.dumps(dict(step=int(step), eval_loss=float(value))), flush=True)


hooks = [tf.train.StopAtStepHook(last_step=args.steps)] + ([FinalLoss()] if index == 0 else [])
with tf.train.MonitoredTrainingSession(master=target, is_chief=index == 0, checkpoint_dir=args.checkpoint_dir,
                                       hooks=hooks, save_checkpoint_steps=50, save_summaries_steps=None,
                                       save_incremental_checkpoint_secs=args.incremental_ckpt) as sess:
    while not sess.should_stop():
        sess.run(train_op)
