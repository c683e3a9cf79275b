"""A TF 1.x tf.contrib.slim program, unchanged: slim layers in an arg_scope, slim.learning.train, slim's evaluator.

The shape of slim's train_image_classifier.py / eval_image_classifier.py, made
small: the cluster arrives as --ps_hosts --worker_hosts --job_name
--task_index, or as TF_CONFIG (with a chief); the ps joins forever; the workers train a slim MLP on examples
made in the graph (no data files) with slim.learning.train, asynchronously or
with --sync_replicas (SyncReplicasOptimizer, slim's sync_optimizer=);
--num_clones N builds N clones per worker the model_deploy way (variables on
the ps through slim's arg_scope, gradients summed on the worker). The evaluator
task runs slim.evaluation.evaluation_loop on the chief's checkpoints until the
last one. Without --job_name it trains in one process. Do not modernise: it is
the unchanged TF 1.x code that tfcluster's TF1 mode must run.
"""
import json
import os
import time

import tensorflow as tf

slim = tf.contrib.slim

flags = tf.app.flags
flags.DEFINE_string("ps_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("worker_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("job_name", "", "One of 'ps', 'worker', 'evaluator'; none: one process")
flags.DEFINE_integer("task_index", 0, "Index of task within the job")
flags.DEFINE_string("train_dir", "/tmp/slim_train", "Where the chief writes checkpoints and summaries")
flags.DEFINE_integer("max_number_of_steps", 200, "The global step to train to")
flags.DEFINE_boolean("sync_replicas", False, "Aggregate the workers' gradients with SyncReplicasOptimizer")
flags.DEFINE_integer("num_clones", 1, "Model clones per worker (model_deploy)")
flags.DEFINE_integer("batch_size", 32, "Examples per clone per step")
FLAGS = flags.FLAGS

FEATURES = 8


def examples(batch_size, seed=None):
    """Random points; the label is which side of a fixed plane they fall on."""
    x = tf.random_normal([batch_size, FEATURES], seed=seed)
    plane = tf.constant([[1.0, -2.0, 0.5, 1.5, -1.0, 0.25, 2.0, -0.5]])
    labels = tf.cast(tf.reduce_sum(x * plane, axis=1) > 0, tf.int64)
    return x, labels


def network(x, is_training=True):
    with slim.arg_scope([slim.fully_connected], activation_fn=tf.nn.relu,
                        weights_regularizer=slim.l2_regularizer(1e-4)):
        net = slim.fully_connected(x, 32, scope="fc1")
        net = slim.dropout(net, 0.9, is_training=is_training, scope="dropout1")
        net = slim.fully_connected(net, 16, scope="fc2")
        return slim.fully_connected(net, 2, activation_fn=None, scope="logits")


def clone_loss(scope):
    x, labels = examples(FLAGS.batch_size)
    logits = network(x)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits, scope=scope)
    return loss


class _PSDeviceChooser(object):
    """model_deploy's: Variable ops on the ps tasks round robin, other ops where they are."""

    def __init__(self, device, tasks):
        self._device = device
        self._tasks = tasks
        self._task = 0

    def choose(self, op):
        if op.device:
            return op.device
        node_def = op if isinstance(op, tf.NodeDef) else op.node_def
        if node_def.op.startswith("Variable"):
            t = self._task
            self._task = (self._task + 1) % self._tasks
            return "%s/task:%d/device:CPU:0" % (self._device, t)
        return op.device


def variables_device(ps_tasks):
    """model_deploy's DeploymentConfig.variables_device()."""
    return _PSDeviceChooser("/job:ps", ps_tasks).choose


def build_train_op(worker_device, ps_tasks, num_workers):
    optimizer = tf.train.GradientDescentOptimizer(0.5)
    if FLAGS.sync_replicas:
        optimizer = tf.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=num_workers,
                                                   total_num_replicas=num_workers)
    if FLAGS.num_clones == 1:
        with tf.device(tf.train.replica_device_setter(ps_tasks=ps_tasks, worker_device=worker_device)):
            slim.get_or_create_global_step()
            clone_loss(None)
            total_loss = tf.losses.get_total_loss()
            return slim.learning.create_train_op(total_loss, optimizer), optimizer
    # model_deploy: variables on the ps, clone i on this worker's CPU, the gradients summed on the worker.
    with tf.device("/job:ps/task:0/device:CPU:0" if ps_tasks else worker_device):
        global_step = slim.get_or_create_global_step()
    grads_and_vars, losses = None, []
    with slim.arg_scope([slim.model_variable, slim.variable],
                        device=variables_device(ps_tasks) if ps_tasks else worker_device):
        for i in range(FLAGS.num_clones):
            with tf.name_scope("clone_%d" % i) as scope, tf.device(worker_device):
                with tf.variable_scope(tf.get_variable_scope(), reuse=True if i > 0 else None):
                    loss = clone_loss(scope)
                    losses.append(loss)
                    clone_grads = optimizer.compute_gradients(loss / FLAGS.num_clones)
                    if grads_and_vars is None:
                        grads_and_vars = clone_grads
                    else:
                        grads_and_vars = [(g0 + g1, v) for (g0, v), (g1, _) in zip(grads_and_vars, clone_grads)]
    with tf.device(worker_device):
        total_loss = tf.add_n(losses) / FLAGS.num_clones + tf.add_n(tf.losses.get_regularization_losses())
        update = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
        with tf.control_dependencies([update]):
            train_op = tf.identity(total_loss, name="train_op")
    return train_op, optimizer


def evaluate():
    """slim's evaluator: every new checkpoint of the chief, until the one at the last step."""
    x, labels = examples(500, seed=7)
    predictions = tf.argmax(network(x, is_training=False), 1)
    names_to_values, names_to_updates = slim.metrics.aggregate_metric_map({
        "accuracy": slim.metrics.streaming_accuracy(predictions, labels)})
    global_step = slim.get_or_create_global_step()

    class Report(tf.train.SessionRunHook):
        def end(self, session):
            step, accuracy = session.run([global_step, names_to_values["accuracy"]])
            print("evaluator: global step %d accuracy %.4f" % (step, accuracy), flush=True)

    def trained_out():
        latest = tf.train.latest_checkpoint(FLAGS.train_dir)
        return latest is not None and int(latest.rsplit("-", 1)[1]) >= FLAGS.max_number_of_steps

    slim.evaluation.evaluation_loop("", FLAGS.train_dir, FLAGS.train_dir + "/eval", num_evals=1,
                                    eval_op=list(names_to_updates.values()), eval_interval_secs=1,
                                    hooks=[Report()], timeout=2, timeout_fn=trained_out)


def main(_):
    tf.logging.set_verbosity(tf.logging.INFO)
    if FLAGS.job_name == "evaluator":
        return evaluate()
    ps_tasks, num_workers, master, is_chief = 0, 1, "", True
    worker_device = "/job:localhost/replica:0/task:0/device:CPU:0"
    job_name, task_index = FLAGS.job_name, FLAGS.task_index
    if job_name:
        cluster = tf.train.ClusterSpec({"ps": FLAGS.ps_hosts.split(","), "worker": FLAGS.worker_hosts.split(",")})
    elif "TF_CONFIG" in os.environ:      # the cluster as Cloud ML Engine and Kubeflow give it
        tf_config = json.loads(os.environ["TF_CONFIG"])
        cluster = tf.train.ClusterSpec(tf_config["cluster"])
        job_name, task_index = tf_config["task"]["type"], tf_config["task"]["index"]
        if job_name == "evaluator":
            return evaluate()
    if job_name:
        server = tf.train.Server(cluster, job_name=job_name, task_index=task_index)
        if job_name == "ps":
            server.join()
        jobs = cluster.as_dict()
        ps_tasks, num_workers = len(jobs.get("ps", [])), len(jobs.get("chief", [])) + len(jobs.get("worker", []))
        master, is_chief = server.target, job_name == "chief" or (job_name == "worker" and task_index == 0
                                                                  and "chief" not in jobs)
        worker_device = "/job:%s/task:%d/device:CPU:0" % (job_name, task_index)
    train_op, optimizer = build_train_op(worker_device, ps_tasks, num_workers)
    steps = [0]

    def train_step_fn(session, train_op, global_step, train_step_kwargs):
        total_loss, should_stop = slim.learning.train_step(session, train_op, global_step, train_step_kwargs)
        steps[0] += 1
        if steps[0] == 1:
            print("%s %d: first step at %.3f" % (job_name or "worker", task_index, time.time()), flush=True)
        if steps[0] % 20 == 0:
            print("%s %d: local step %d, loss %.4f" % (job_name or "worker", task_index, steps[0], total_loss),
                  flush=True)
        return total_loss, should_stop

    final_loss = slim.learning.train(train_op, FLAGS.train_dir, train_step_fn=train_step_fn, master=master,
                                     is_chief=is_chief, number_of_steps=FLAGS.max_number_of_steps,
                                     sync_optimizer=optimizer if FLAGS.sync_replicas else None,
                                     log_every_n_steps=50, save_summaries_secs=5, save_interval_secs=2)
    print("%s %d: done after %d local steps, final loss %.4f" % (job_name or "worker", task_index, steps[0],
                                                                final_loss), flush=True)


if __name__ == "__main__":
    tf.app.run()
