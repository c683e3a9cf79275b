"""Synchronous TF 1.x training, its session made each way TF 1.x's docs showed, on a cluster or in one process.

Each worker trains a linear model on its own fixed batch with
SyncReplicasOptimizer over every worker and gradient descent, until global step
--train_steps; --session names how the session is made:

- ``supervisor``: tf.train.Supervisor as TF's mnist_replica.py makes it: chief_init_op or
  local_step_init_op as local init, ready_for_local_init_op, prepare_or_wait_for_session, then the
  chief runs the init tokens op and starts the chief queue runner;
- ``supervisor-init-first``: the same with its init_op built before the optimizer;
- ``managed``: Supervisor.managed_session, as the Supervisor's own docs show it;
- ``session-manager``: tf.train.SessionManager, prepare_session on the chief, wait_for_session elsewhere;
- ``monitored``: MonitoredTrainingSession with opt.make_session_run_hook(is_chief).

The cluster comes from the four TF1 flags when given, else from TF_CONFIG;
with neither, the program makes one ps and --workers worker servers itself
and trains each worker in a thread, as TensorFlow's own SyncReplicasOptimizer
test did (--session may then list several ways, one run each, fresh servers
for each). The chief prints ``RESULT`` and a JSON line: its final global step
and weights, and what each worker's ready check (the one its session maker
uses) reported uninitialised once its session was made; every worker prints
``worker N: done after K local steps``. Run in TF1 mode.
"""
import json
import os
import socket
import sys
import tempfile
import threading
import traceback

import numpy as np
import tensorflow as tf

flags = tf.app.flags
flags.DEFINE_string("ps_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("worker_hosts", "", "Comma-separated list of hostname:port pairs")
flags.DEFINE_string("job_name", "", "One of 'ps', 'worker'")
flags.DEFINE_integer("task_index", 0, "Index of task within the job")
flags.DEFINE_string("session", "supervisor", "How the session is made (comma-separated in one process)")
flags.DEFINE_integer("train_steps", 10, "Number of (global) training steps to perform")
flags.DEFINE_integer("workers", 2, "Workers trained as threads when no cluster is given")
FLAGS = flags.FLAGS

LEARNING_RATE = 0.05


def batch(task):
    """Worker ``task``'s fixed batch (tests/test_tf1_sync.py computes the same)."""
    rng = np.random.RandomState(task)
    xs = rng.rand(16, 4).astype(np.float32)
    ys = xs.dot(np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)) + task
    return xs, ys


def train(kind, task, num_workers, target, result):
    is_chief = task == 0
    steps = FLAGS.train_steps
    graph = tf.Graph()
    with graph.as_default():
        xs, ys = batch(task)
        with tf.device(tf.train.replica_device_setter(ps_tasks=1, worker_device="/job:worker/task:%d" % task)):
            w = tf.get_variable("w", [4, 1], initializer=tf.zeros_initializer())
            global_step = tf.train.get_or_create_global_step()
            if kind == "supervisor-init-first":
                init_op = tf.global_variables_initializer()
            loss = tf.reduce_mean(tf.square(tf.matmul(tf.constant(xs), w) - tf.constant(ys)))
            opt = tf.train.SyncReplicasOptimizer(tf.train.GradientDescentOptimizer(LEARNING_RATE),
                                                 replicas_to_aggregate=num_workers, total_num_replicas=num_workers)
            train_op = opt.minimize(loss, global_step=global_step)
        if kind != "supervisor-init-first":
            init_op = tf.global_variables_initializer()
        local_init_op = opt.chief_init_op if is_chief else opt.local_step_init_op
        if is_chief:
            chief_queue_runner, sync_init_op = opt.get_chief_queue_runner(), opt.get_init_tokens_op()
        local_steps = 0

        if kind == "monitored":
            scaffold = tf.train.Scaffold()
            hooks = [opt.make_session_run_hook(is_chief), tf.train.StopAtStepHook(last_step=steps)]
            checkpoint_dir = tempfile.mkdtemp() if is_chief else None
            with tf.train.MonitoredTrainingSession(master=target, is_chief=is_chief, scaffold=scaffold,
                                                   checkpoint_dir=checkpoint_dir, hooks=hooks) as sess:
                result["unready"][task] = [s.decode() for s in sess.run(scaffold.ready_op)]
                while not sess.should_stop():
                    sess.run(train_op)
                    local_steps += 1
            if is_chief:        # the chief's last checkpoint holds the model it ended with
                last = tf.train.latest_checkpoint(checkpoint_dir)
                result["global step"] = int(tf.train.load_variable(last, "global_step"))
                result["w"] = tf.train.load_variable(last, "w").tolist()
        else:
            if kind == "session-manager":
                ready_op = tf.report_uninitialized_variables()
                sm = tf.train.SessionManager(local_init_op=local_init_op, ready_op=ready_op,
                                             ready_for_local_init_op=opt.ready_for_local_init_op,
                                             recovery_wait_secs=1)
                sess = sm.prepare_session(target, init_op=init_op) if is_chief else sm.wait_for_session(target)
                sv = None
            else:
                sv = tf.train.Supervisor(is_chief=is_chief, logdir=tempfile.mkdtemp(), init_op=init_op,
                                         local_init_op=local_init_op,
                                         ready_for_local_init_op=opt.ready_for_local_init_op,
                                         recovery_wait_secs=1, global_step=global_step)
                ready_op = sv.ready_op
                if kind == "managed":
                    managed = sv.managed_session(target)
                    sess = managed.__enter__()
                else:
                    sess = sv.prepare_or_wait_for_session(target)
            result["unready"][task] = [s.decode() for s in sess.run(ready_op)]
            if is_chief:
                sess.run(sync_init_op)
                if sv is not None:
                    sv.start_queue_runners(sess, [chief_queue_runner])
            while True:
                _, step = sess.run([train_op, global_step])
                local_steps += 1
                if step >= steps:
                    break
            if is_chief:
                result["global step"], result["w"] = [x.tolist() for x in sess.run([global_step, w])]
            if kind == "managed":
                managed.__exit__(None, None, None)
            elif sv is not None:
                sv.stop()
    print("worker %d: done after %d local steps" % (task, local_steps), flush=True)


def free_port():
    s = socket.socket()
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def servers_in_this_process(workers, attempts=3):
    """A ps and ``workers`` worker servers in this process, on ports free when picked.

    A port found free may be taken by another process before its server binds it
    (the suite runs two test processes): TF then fails with "Could not start gRPC
    server", and the cluster is tried again on other ports.
    """
    for attempt in range(attempts):
        spec = tf.train.ClusterSpec({"ps": ["localhost:%d" % free_port()],
                                     "worker": ["localhost:%d" % free_port() for _ in range(workers)]})
        try:
            tf.train.Server(spec, job_name="ps", task_index=0)
            return [tf.train.Server(spec, job_name="worker", task_index=i) for i in range(workers)]
        except tf.errors.OpError as e:
            if "Could not start gRPC server" not in str(e) or attempt == attempts - 1:
                raise


def in_one_process(kind):
    """One ps and FLAGS.workers workers in this process, each worker a thread."""
    workers = servers_in_this_process(FLAGS.workers)
    result = {"session": kind, "unready": {}}

    def worker(i):
        try:
            train(kind, i, FLAGS.workers, workers[i].target, result)
        except BaseException:       # the other workers would wait for this one for ever: end the run
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(FLAGS.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("RESULT " + json.dumps(result), flush=True)


def main(_):
    if FLAGS.job_name:
        cluster = {"ps": FLAGS.ps_hosts.split(","), "worker": FLAGS.worker_hosts.split(",")}
        job_name, task_index = FLAGS.job_name, FLAGS.task_index
    elif "TF_CONFIG" in os.environ:
        tf_config = json.loads(os.environ["TF_CONFIG"])
        cluster, job_name, task_index = tf_config["cluster"], tf_config["task"]["type"], tf_config["task"]["index"]
    else:
        for kind in FLAGS.session.split(","):
            in_one_process(kind)
        return
    server = tf.train.Server(tf.train.ClusterSpec(cluster), job_name=job_name, task_index=task_index)
    if job_name == "ps":
        server.join()
    result = {"session": FLAGS.session, "unready": {}}
    train(FLAGS.session, task_index, len(cluster["worker"]), server.target, result)
    print(("RESULT " if task_index == 0 else "worker %d: " % task_index) + json.dumps(result), flush=True)


if __name__ == "__main__":
    tf.app.run()
