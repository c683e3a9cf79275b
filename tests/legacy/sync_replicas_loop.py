"""Synchronous TF 1.x training as most scripts wrote it: replica_device_setter, SyncReplicasOptimizer, its hook.

Run under TF1 mode (``import tensorflow as tf`` is tf.compat.v1) with TF_CONFIG
from the launcher; it trains a linear model on a fixed synthetic batch until
global step ``--steps`` and prints a line per step. Do not modernise: it is the
unchanged TF 1.x code whose waits TensorFlow left unbounded.
"""
import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--step-sleep", type=float, default=0.0)
args = p.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
cluster_def, task = tf_config["cluster"], tf_config["task"]
job_name, task_index = task["type"], task["index"]
cluster = tf.train.ClusterSpec(cluster_def)
server = tf.train.Server(cluster, job_name=job_name, task_index=task_index)
is_chief = job_name == "chief" or (job_name == "worker" and task_index == 0 and "chief" not in cluster_def)
num_replicas = len(cluster_def.get("worker", [])) + len(cluster_def.get("chief", []))

rng = np.random.RandomState(task_index)
xs = rng.rand(32, 4).astype(np.float32)
ys = xs.dot(np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32))
with tf.device(tf.train.replica_device_setter(worker_device="/job:%s/task:%d" % (job_name, task_index),
                                              cluster=cluster)):
    w = tf.get_variable("w", [4, 1], initializer=tf.zeros_initializer())
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.constant(xs), w) - tf.constant(ys)))
    global_step = tf.train.get_or_create_global_step()
    opt = tf.train.SyncReplicasOptimizer(tf.train.GradientDescentOptimizer(0.05), replicas_to_aggregate=num_replicas,
                                         total_num_replicas=num_replicas)
    train_op = opt.minimize(loss, global_step=global_step)

hooks = [opt.make_session_run_hook(is_chief), tf.train.StopAtStepHook(last_step=args.steps)]
with tf.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks) as sess:
    while not sess.should_stop():
        _, step = sess.run([train_op, global_step])
        print("%s:%d step %d" % (job_name, task_index, step), flush=True)
        time.sleep(args.step_sleep)
print("%s:%d done" % (job_name, task_index))
