"""Peer: asynchronous PS training as a TF1 user writes it by hand.

replica_device_setter + MonitoredTrainingSession + feed_dict, with the classic
four flags. The ps calls server.join() and never exits, as in the tutorials.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tensorflow as tf  # noqa: E402

from common import Meter, four_flags, mlp_logits, report, synthetic  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

p = four_flags(argparse.ArgumentParser())
p.add_argument("--batch", type=int, default=128)
p.add_argument("--steps", type=int, default=2000, help="global steps")
a = p.parse_args()

cluster = tf1.train.ClusterSpec({"ps": a.ps_hosts.split(","), "worker": a.worker_hosts.split(",")})
server = tf1.train.Server(cluster, job_name=a.job_name, task_index=a.task_index)
if a.job_name == "ps":
    server.join()

with tf1.device(tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{a.task_index}", cluster=cluster)):
    x = tf1.placeholder(tf.float32, [None, 784])
    y = tf1.placeholder(tf.int32, [None])
    logits = mlp_logits(tf1, x)
    loss = tf1.reduce_mean(tf1.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    global_step = tf1.train.get_or_create_global_step()
    train_op = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=global_step)

data_x, data_y = synthetic()
rng = __import__("numpy").random.RandomState(a.task_index)
meter = Meter(a.batch)
started = time.time()
hooks = [tf1.train.StopAtStepHook(last_step=a.steps)]
# Without device filters a non-chief that starts after the chief has finished
# waits forever for it (pitfalls item 3); TF's own distributed examples set them.
config = tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{a.task_index}"])
with tf1.train.MonitoredTrainingSession(master=server.target, is_chief=a.task_index == 0, hooks=hooks,
                                       config=config) as sess:
    while not sess.should_stop():
        idx = rng.randint(0, len(data_x), a.batch)
        sess.run(train_op, feed_dict={x: data_x[idx], y: data_y[idx]})
        meter.step()
report(meter.result(peer="raw_tf1", task=a.task_index, started=started))
