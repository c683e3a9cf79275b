"""In-graph replication with hard-coded hosts, two flags and a Supervisor, the TF 1.x way.

Old tutorial scripts wrote their cluster into the code (localhost:2222-2224)
and took only --job_name and --task_index. Here worker 0 is the only client:
it builds one tower per worker, averages their gradients and drives both
workers through a Supervisor; the ps and worker 1 sit in server.join() for
ever. The test writes free ports in place of the __PORT__ markers (a real
script would say 2222, 2223, 2224) and the data directory in place of
__DATA_DIR__. Do not modernise: it is the unchanged TF 1.x code that TF1 mode
must run.
"""
import tensorflow as tf
from tensorflow.examples.tutorials.mnist import input_data

cluster = tf.train.ClusterSpec({
    "ps": ["localhost:__PS_PORT__"],
    "worker": ["localhost:__WORKER0_PORT__", "localhost:__WORKER1_PORT__"],
})

tf.app.flags.DEFINE_string("job_name", "", "One of 'ps', 'worker'")
tf.app.flags.DEFINE_integer("task_index", 0, "Index of task within the job")
FLAGS = tf.app.flags.FLAGS

DATA_DIR = "__DATA_DIR__"
TRAIN_STEPS = 120
BATCH_PER_TOWER = 50


def main(_):
    server = tf.train.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_index)
    if FLAGS.job_name == "ps" or FLAGS.task_index != 0:
        server.join()
        return

    mnist = input_data.read_data_sets(DATA_DIR, one_hot=True)
    with tf.device("/job:ps/task:0"):
        W = tf.get_variable("W", [784, 10], initializer=tf.contrib.layers.xavier_initializer())
        b = tf.Variable(tf.zeros([10]), name="b")
        global_step = tf.contrib.framework.get_or_create_global_step()

    opt = tf.train.GradientDescentOptimizer(0.5)
    inputs, tower_grads, tower_losses = [], [], []
    for i in range(cluster.num_tasks("worker")):
        with tf.device("/job:worker/task:%d" % i):
            x = tf.placeholder(tf.float32, [None, 784])
            y_ = tf.placeholder(tf.float32, [None, 10])
            logits = tf.matmul(x, W) + b
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits_v2(labels=y_, logits=logits))
            inputs.append((x, y_))
            tower_losses.append(loss)
            tower_grads.append(opt.compute_gradients(loss, [W, b]))

    averaged = []
    for grads_and_vars in zip(*tower_grads):
        grads = [g for g, _ in grads_and_vars]
        averaged.append((tf.add_n(grads) / len(grads), grads_and_vars[0][1]))
    train_op = opt.apply_gradients(averaged, global_step=global_step)
    mean_loss = tf.add_n(tower_losses) / len(tower_losses)

    sv = tf.train.Supervisor(is_chief=True, global_step=global_step,
                             init_op=tf.global_variables_initializer())
    with sv.managed_session(server.target) as sess:
        step = 0
        while not sv.should_stop() and step < TRAIN_STEPS:
            feed = {}
            for x, y_ in inputs:
                batch_xs, batch_ys = mnist.train.next_batch(BATCH_PER_TOWER)
                feed[x], feed[y_] = batch_xs, batch_ys
            _, loss_value, step = sess.run([train_op, mean_loss, global_step], feed_dict=feed)
            if step % 10 == 0:
                print("step %d, loss %.4f" % (step, loss_value))
    print("chief done at step %d" % step)


if __name__ == "__main__":
    tf.app.run()
