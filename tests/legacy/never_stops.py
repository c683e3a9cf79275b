"""A training loop that never stops by itself, the TF 1.x way.

Many TF 1.x scripts ran `while not sess.should_stop()` with no stop hook and
relied on someone pressing Ctrl-C; this one is in that style (four flags,
MonitoredTrainingSession, MNIST). Under a launcher it must be ended by a
timeout, with everything cleaned up. Do not modernise: it is the unchanged TF
1.x code that TF1 mode must run.
"""
import tensorflow as tf
from tensorflow.examples.tutorials.mnist import input_data

flags = tf.app.flags
flags.DEFINE_string("ps_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("worker_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("job_name", "", "One of 'ps', 'worker'")
flags.DEFINE_integer("task_index", 0, "Index of task within the job")
flags.DEFINE_string("data_dir", "/tmp/mnist-data", "Directory for storing input data")
FLAGS = flags.FLAGS


def main(_):
    cluster = tf.train.ClusterSpec({"ps": FLAGS.ps_hosts.split(","), "worker": FLAGS.worker_hosts.split(",")})
    server = tf.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)
    if FLAGS.job_name == "ps":
        server.join()
        return
    mnist = input_data.read_data_sets(FLAGS.data_dir, one_hot=True)
    with tf.device(tf.train.replica_device_setter(cluster=cluster)):
        x = tf.placeholder(tf.float32, [None, 784])
        y_ = tf.placeholder(tf.float32, [None, 10])
        W = tf.Variable(tf.zeros([784, 10]))
        b = tf.Variable(tf.zeros([10]))
        y = tf.matmul(x, W) + b
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=y))
        global_step = tf.contrib.framework.get_or_create_global_step()
        train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=global_step)

    with tf.train.MonitoredTrainingSession(master=server.target, is_chief=(FLAGS.task_index == 0)) as sess:
        while not sess.should_stop():
            batch_xs, batch_ys = mnist.train.next_batch(50)
            _, loss_value, step = sess.run([train_op, loss, global_step], feed_dict={x: batch_xs, y_: batch_ys})
            if step % 20 == 0:
                print("step %d, loss %.4f" % (step, loss_value))


if __name__ == "__main__":
    tf.app.run()
