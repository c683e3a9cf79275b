"""A classic TF1 between-graph replication script, as the TF 1.x tutorials wrote them.

One script, role by flag: ps tasks call server.join() and never return; workers
train a linear model with replica_device_setter and MonitoredTrainingSession
until a StopAtStepHook ends them. Nothing here knows about tfcluster.
"""
import argparse

import tensorflow.compat.v1 as tf

parser = argparse.ArgumentParser()
parser.add_argument("--job_name", required=True)
parser.add_argument("--task_index", type=int, required=True)
parser.add_argument("--ps_hosts", required=True)
parser.add_argument("--worker_hosts", required=True)
parser.add_argument("--last_step", type=int, default=50)
FLAGS = parser.parse_args()

tf.disable_v2_behavior()
cluster = tf.train.ClusterSpec({"ps": FLAGS.ps_hosts.split(","), "worker": FLAGS.worker_hosts.split(",")})
server = tf.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)

if FLAGS.job_name == "ps":
    print("ps serving; join()", flush=True)
    server.join()
else:
    worker_device = "/job:worker/task:%d" % FLAGS.task_index
    with tf.device(tf.train.replica_device_setter(worker_device=worker_device, cluster=cluster)):
        global_step = tf.train.get_or_create_global_step()
        x = tf.random_uniform([32, 1])
        y = 3.0 * x + 1.0
        w = tf.get_variable("w", [1, 1], initializer=tf.zeros_initializer())
        b = tf.get_variable("b", [1], initializer=tf.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)
    # Without device filters each session waits for every other worker.
    config = tf.ConfigProto(device_filters=["/job:ps", worker_device])
    hooks = [tf.train.StopAtStepHook(last_step=FLAGS.last_step)]
    steps = 0
    with tf.train.MonitoredTrainingSession(master=server.target, is_chief=(FLAGS.task_index == 0),
                                           hooks=hooks, config=config) as sess:
        while not sess.should_stop():
            _, step, value = sess.run([train_op, global_step, loss])
            steps += 1
    print("worker %d done: ran %d steps, global step %d, loss %.4f" % (FLAGS.task_index, steps, step, value),
          flush=True)
