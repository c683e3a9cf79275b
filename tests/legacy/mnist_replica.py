"""Distributed MNIST with model replicas: the shape of TensorFlow's own tools/dist_test/python/mnist_replica.py.

Four flags carry the cluster; the ps joins for ever; a softmax model with one
hidden layer lives on the ps through replica_device_setter; with
--sync_replicas, SyncReplicasOptimizer aggregates every worker's gradient and
tf.train.Supervisor prepares the session: chief_init_op as the chief's local
init, local_step_init_op elsewhere, ready_for_local_init_op, then the chief runs
the init tokens op and starts the chief queue runner. Most TF 1.x tutorials'
sync examples copied this. Do not modernise: it is the unchanged TF 1.x code
that TF1 mode must run (``tfcluster local --tf1 --legacy-flags``).
"""
import math
import tempfile
import time

import tensorflow as tf
from tensorflow.examples.tutorials.mnist import input_data

flags = tf.app.flags
flags.DEFINE_string("data_dir", "/tmp/mnist-data", "Directory for storing mnist data")
flags.DEFINE_integer("task_index", None, "Worker task index, should be >= 0; 0 is the chief")
flags.DEFINE_integer("num_gpus", 0, "Total number of gpus for each machine; 0 for none")
flags.DEFINE_integer("replicas_to_aggregate", None, "Replicas to aggregate per update (default: num_workers)")
flags.DEFINE_integer("hidden_units", 100, "Number of units in the hidden layer of the NN")
flags.DEFINE_integer("train_steps", 200, "Number of (global) training steps to perform")
flags.DEFINE_integer("batch_size", 100, "Training batch size")
flags.DEFINE_float("learning_rate", 0.01, "Learning rate")
flags.DEFINE_boolean("sync_replicas", False, "Aggregate the replicas' updates before applying them")
flags.DEFINE_string("ps_hosts", "localhost:2222", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("worker_hosts", "localhost:2223,localhost:2224", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("job_name", None, "job name: worker or ps")
FLAGS = flags.FLAGS

IMAGE_PIXELS = 28


def main(unused_argv):
    mnist = input_data.read_data_sets(FLAGS.data_dir, one_hot=True)
    if FLAGS.job_name is None or FLAGS.job_name == "":
        raise ValueError("Must specify an explicit `job_name`")
    if FLAGS.task_index is None or FLAGS.task_index == "":
        raise ValueError("Must specify an explicit `task_index`")
    print("job name = %s" % FLAGS.job_name)
    print("task index = %d" % FLAGS.task_index)

    ps_spec = FLAGS.ps_hosts.split(",")
    worker_spec = FLAGS.worker_hosts.split(",")
    num_workers = len(worker_spec)
    cluster = tf.train.ClusterSpec({"ps": ps_spec, "worker": worker_spec})
    server = tf.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)
    if FLAGS.job_name == "ps":
        server.join()

    is_chief = (FLAGS.task_index == 0)
    if FLAGS.num_gpus > 0:
        gpu = (FLAGS.task_index % FLAGS.num_gpus)
        worker_device = "/job:worker/task:%d/gpu:%d" % (FLAGS.task_index, gpu)
    else:
        worker_device = "/job:worker/task:%d/cpu:0" % FLAGS.task_index

    with tf.device(tf.train.replica_device_setter(worker_device=worker_device, ps_device="/job:ps/cpu:0",
                                                  cluster=cluster)):
        global_step = tf.Variable(0, name="global_step", trainable=False)

        hid_w = tf.Variable(tf.truncated_normal([IMAGE_PIXELS * IMAGE_PIXELS, FLAGS.hidden_units],
                                                stddev=1.0 / IMAGE_PIXELS), name="hid_w")
        hid_b = tf.Variable(tf.zeros([FLAGS.hidden_units]), name="hid_b")
        sm_w = tf.Variable(tf.truncated_normal([FLAGS.hidden_units, 10],
                                               stddev=1.0 / math.sqrt(FLAGS.hidden_units)), name="sm_w")
        sm_b = tf.Variable(tf.zeros([10]), name="sm_b")

        x = tf.placeholder(tf.float32, [None, IMAGE_PIXELS * IMAGE_PIXELS])
        y_ = tf.placeholder(tf.float32, [None, 10])
        hid = tf.nn.relu(tf.nn.xw_plus_b(x, hid_w, hid_b))
        y = tf.nn.softmax(tf.nn.xw_plus_b(hid, sm_w, sm_b))
        cross_entropy = -tf.reduce_sum(y_ * tf.log(tf.clip_by_value(y, 1e-10, 1.0)))

        opt = tf.train.AdamOptimizer(FLAGS.learning_rate)
        if FLAGS.sync_replicas:
            if FLAGS.replicas_to_aggregate is None:
                replicas_to_aggregate = num_workers
            else:
                replicas_to_aggregate = FLAGS.replicas_to_aggregate
            opt = tf.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=replicas_to_aggregate,
                                                 total_num_replicas=num_workers, name="mnist_sync_replicas")

        train_step = opt.minimize(cross_entropy, global_step=global_step)

        if FLAGS.sync_replicas:
            local_init_op = opt.local_step_init_op
            if is_chief:
                local_init_op = opt.chief_init_op
            ready_for_local_init_op = opt.ready_for_local_init_op
            # Initial token and chief queue runners required by the sync_replicas mode
            chief_queue_runner = opt.get_chief_queue_runner()
            sync_init_op = opt.get_init_tokens_op()

        init_op = tf.global_variables_initializer()
        train_dir = tempfile.mkdtemp()

        if FLAGS.sync_replicas:
            sv = tf.train.Supervisor(is_chief=is_chief, logdir=train_dir, init_op=init_op,
                                     local_init_op=local_init_op, ready_for_local_init_op=ready_for_local_init_op,
                                     recovery_wait_secs=1, global_step=global_step)
        else:
            sv = tf.train.Supervisor(is_chief=is_chief, logdir=train_dir, init_op=init_op, recovery_wait_secs=1,
                                     global_step=global_step)

        sess_config = tf.ConfigProto(allow_soft_placement=True, log_device_placement=False,
                                     device_filters=["/job:ps", "/job:worker/task:%d" % FLAGS.task_index])
        if is_chief:
            print("Worker %d: Initializing session..." % FLAGS.task_index)
        else:
            print("Worker %d: Waiting for session to be initialized..." % FLAGS.task_index)
        sess = sv.prepare_or_wait_for_session(server.target, config=sess_config)
        print("Worker %d: Session initialization complete." % FLAGS.task_index)

        if FLAGS.sync_replicas and is_chief:
            # Chief worker will start the chief queue runner and call the init op.
            sess.run(sync_init_op)
            sv.start_queue_runners(sess, [chief_queue_runner])

        time_begin = time.time()
        print("Training begins @ %f" % time_begin)
        local_step = 0
        while True:
            batch_xs, batch_ys = mnist.train.next_batch(FLAGS.batch_size)
            train_feed = {x: batch_xs, y_: batch_ys}
            _, step = sess.run([train_step, global_step], feed_dict=train_feed)
            local_step += 1
            now = time.time()
            print("%f: Worker %d: training step %d done (global step: %d)" % (now, FLAGS.task_index, local_step,
                                                                              step))
            if step >= FLAGS.train_steps:
                break

        time_end = time.time()
        print("Training ends @ %f" % time_end)
        print("Training elapsed time: %f s" % (time_end - time_begin))

        val_feed = {x: mnist.validation.images, y_: mnist.validation.labels}
        val_xent = sess.run(cross_entropy, feed_dict=val_feed)
        print("After %d training step(s), validation cross entropy = %g" % (FLAGS.train_steps, val_xent))


if __name__ == "__main__":
    tf.app.run()
