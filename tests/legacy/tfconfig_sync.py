"""Synchronous training from TF_CONFIG with a chief: SyncReplicasOptimizer, the TF 1.x way.

Kubeflow's TFJob, SageMaker and Cloud ML Engine handed TF 1.x scripts their
cluster in TF_CONFIG, with a "chief" job beside the workers. The replicas'
gradients are aggregated by SyncReplicasOptimizer; its session hook starts the
chief queue runner that hands out the step tokens (forget it and every worker
waits for ever). Do not modernise: it is the unchanged TF 1.x code that TF1
mode must run.
"""
import json
import os
import sys

import tensorflow as tf
from tensorflow.examples.tutorials.mnist import input_data

DATA_DIR = sys.argv[1] if len(sys.argv) > 1 else "/tmp/mnist-data"
TRAIN_STEPS = 60

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
cluster_def = tf_config["cluster"]
job_name = tf_config["task"]["type"]
task_index = tf_config["task"]["index"]
cluster = tf.train.ClusterSpec(cluster_def)
server = tf.train.Server(cluster, job_name=job_name, task_index=task_index)

if job_name == "ps":
    server.join()
    sys.exit(0)

is_chief = job_name == "chief"
num_replicas = len(cluster_def.get("worker", [])) + len(cluster_def.get("chief", []))
mnist = input_data.read_data_sets(DATA_DIR, one_hot=True)

with tf.device(tf.train.replica_device_setter(
        worker_device="/job:%s/task:%d" % (job_name, task_index), cluster=cluster)):
    x = tf.placeholder(tf.float32, [None, 784])
    y_ = tf.placeholder(tf.float32, [None, 10])
    W = tf.get_variable("W", [784, 10], initializer=tf.zeros_initializer())
    b = tf.get_variable("b", [10], initializer=tf.zeros_initializer())
    logits = tf.matmul(x, W) + b
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=logits))
    loss += tf.contrib.layers.apply_regularization(tf.contrib.layers.l2_regularizer(1e-4), [W])
    global_step = tf.contrib.framework.get_or_create_global_step()
    opt = tf.train.SyncReplicasOptimizer(tf.train.GradientDescentOptimizer(0.5),
                                         replicas_to_aggregate=num_replicas,
                                         total_num_replicas=num_replicas)
    train_op = opt.minimize(loss, global_step=global_step)

sync_replicas_hook = opt.make_session_run_hook(is_chief)
hooks = [sync_replicas_hook, tf.train.StopAtStepHook(last_step=TRAIN_STEPS)]
device_filters = ["/job:ps", "/job:%s/task:%d" % (job_name, task_index)]
config = tf.ConfigProto(device_filters=device_filters)

with tf.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks,
                                       config=config) as sess:
    while not sess.should_stop():
        batch_xs, batch_ys = mnist.train.next_batch(50)
        _, loss_value, step = sess.run([train_op, loss, global_step], feed_dict={x: batch_xs, y_: batch_ys})
        if step % 5 == 0:
            print("%s %d: global step %d, loss %.4f" % (job_name, task_index, step, loss_value))
print("%s %d: done" % (job_name, task_index))
