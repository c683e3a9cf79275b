"""Between-graph replication, written the TF 1.x way: four flags, MonitoredTrainingSession.

The shape of TensorFlow's own distributed example (mnist_replica / the
"Distributed TensorFlow" how-to): the cluster arrives as --ps_hosts
--worker_hosts --job_name --task_index, the ps joins forever, the workers train
asynchronously on MNIST with tf.layers until a global step. Do not modernise:
it is the unchanged TF 1.x code that tfcluster's TF1 mode must run.
"""
import tensorflow as tf
from tensorflow.examples.tutorials.mnist import input_data

flags = tf.app.flags
flags.DEFINE_string("ps_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("worker_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("job_name", "", "One of 'ps', 'worker'")
flags.DEFINE_integer("task_index", 0, "Index of task within the job")
flags.DEFINE_string("data_dir", "/tmp/mnist-data", "Directory for storing input data")
flags.DEFINE_integer("train_steps", 200, "Number of (global) training steps to perform")
flags.DEFINE_integer("batch_size", 50, "Training batch size")
FLAGS = flags.FLAGS


def main(_):
    ps_hosts = FLAGS.ps_hosts.split(",")
    worker_hosts = FLAGS.worker_hosts.split(",")
    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = tf.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)

    if FLAGS.job_name == "ps":
        server.join()
    elif FLAGS.job_name == "worker":
        mnist = input_data.read_data_sets(FLAGS.data_dir, one_hot=True)

        with tf.device(tf.train.replica_device_setter(
                worker_device="/job:worker/task:%d" % FLAGS.task_index, cluster=cluster)):
            x = tf.placeholder(tf.float32, [None, 784])
            y_ = tf.placeholder(tf.float32, [None, 10])
            hidden = tf.layers.dense(x, 64, activation=tf.nn.relu,
                                     kernel_initializer=tf.contrib.layers.xavier_initializer())
            logits = tf.layers.dense(hidden, 10)
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=logits))
            global_step = tf.contrib.framework.get_or_create_global_step()
            train_op = tf.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)

        hooks = [tf.train.StopAtStepHook(last_step=FLAGS.train_steps)]
        local_step = 0
        with tf.train.MonitoredTrainingSession(master=server.target,
                                               is_chief=(FLAGS.task_index == 0),
                                               hooks=hooks) as mon_sess:
            while not mon_sess.should_stop():
                batch_xs, batch_ys = mnist.train.next_batch(FLAGS.batch_size)
                _, loss_value, step = mon_sess.run([train_op, loss, global_step],
                                                   feed_dict={x: batch_xs, y_: batch_ys})
                if local_step % 10 == 0:
                    print("worker %d: local step %d, global step %d, loss %.4f"
                          % (FLAGS.task_index, local_step, step, loss_value))
                local_step += 1
        print("worker %d: done after %d local steps" % (FLAGS.task_index, local_step))


if __name__ == "__main__":
    tf.app.run()
