"""A queue-runner input pipeline feeding asynchronous training, the TF 1.x way.

Before tf.data, input came through queues filled by background threads:
string_input_producer -> TextLineReader -> decode_csv -> shuffle_batch. The
queue runners call sess.run from their own threads while the training loop
calls it too, on the same gRPC target. The cluster comes from TF_CONFIG (no
chief: worker 0 is the chief), the options from argparse. Do not modernise: it
is the unchanged TF 1.x code that TF1 mode must run.
"""
import argparse
import json
import os

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--train_csv", required=True, help="label,pixel,pixel,... lines")
parser.add_argument("--features", type=int, default=64)
parser.add_argument("--train_steps", type=int, default=150)
args = parser.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(tf_config["cluster"])
job_name, task_index = tf_config["task"]["type"], tf_config["task"]["index"]
server = tf.train.Server(cluster, job_name=job_name, task_index=task_index)
if job_name == "ps":
    server.join()

with tf.device(tf.train.replica_device_setter(worker_device="/job:worker/task:%d" % task_index,
                                              cluster=cluster)):
    filename_queue = tf.train.string_input_producer([args.train_csv], shuffle=True)
    reader = tf.TextLineReader()
    _, line = reader.read(filename_queue)
    columns = tf.decode_csv(line, record_defaults=[[0]] + [[0.0]] * args.features)
    label = columns[0]
    features = tf.stack(columns[1:])
    feature_batch, label_batch = tf.train.shuffle_batch([features, label], batch_size=32, capacity=600,
                                                        min_after_dequeue=200, num_threads=2)

    W = tf.Variable(tf.zeros([args.features, 10]), name="weights")
    b = tf.Variable(tf.zeros([10]), name="biases")
    logits = tf.matmul(feature_batch, W) + b
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=label_batch, logits=logits))
    global_step = tf.contrib.framework.get_or_create_global_step()
    train_op = tf.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=global_step)

hooks = [tf.train.StopAtStepHook(last_step=args.train_steps)]
with tf.train.MonitoredTrainingSession(master=server.target, is_chief=(task_index == 0), hooks=hooks) as sess:
    while not sess.should_stop():
        _, loss_value, step = sess.run([train_op, loss, global_step])
        if step % 10 == 0:
            print("worker %d: step %d, loss %.4f" % (task_index, step, loss_value))
print("worker %d: done" % task_index)
