"""What public TF 1.x scripts needed beyond tf.compat.v1, and the session fixes that apply without TF1 mode.

- ``tf.constant(range(100))``, the tutorials' ``mnist`` model module, ``tf.contrib.learn.datasets.DATASETS``;
- a false "received twice" abort in a queue runner's step is rerun (queue runners step through
  ``make_callable``), so MonitoredTrainingSession never restarts from a checkpoint for it;
- a non-chief that starts after its chief finished and exited still ends: its sessions see only the ps and
  itself (``--session-fixes-only``, for scripts that import ``tensorflow.compat.v1`` themselves);
- a trainer of a cluster with ps tasks that trains a private copy in a local session says so;
- each ``tf.logging`` line shows once, in TF's format, or in absl's once ``tf.app.run`` set absl's logging up;
- a SyncReplicasOptimizer push is finished once, and the thread that pushed returns only after its step is applied,
  whichever thread's run looks first (a Supervisor's checkpoint thread runs beside the train thread).
"""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import forks
from conftest import REPO, base_env
from held_ports import REUSE
from tfcluster.topology.cluster import Cluster

PY = sys.executable
TF1 = [PY, "-m", "tfcluster.tf1"]
LEGACY = os.path.join(REPO, "tests", "legacy")


def run_tf1(tmp_path, text, *args, env=None, runner=TF1, timeout=120, forked=True):
    """``python -m tfcluster.tf1 script.py ARGS`` on ``text``: forked as tfcluster local --tf1 forks a task
    (tests/forks.py), or (``forked=False``) started as typed."""
    script = tmp_path / "script.py"
    script.write_text(text)
    argv = [str(a) for a in runner + [script, *args]]
    if forked:
        return forks.run(argv, env or base_env(), cwd=tmp_path, timeout=timeout)
    return subprocess.run(argv, capture_output=True, text=True, env=env or base_env(), timeout=timeout,
                          cwd=str(tmp_path))


NAMES = r'''
import json
import numpy as np
import tensorflow as tf
from tensorflow.examples.tutorials.mnist import mnist
out = {"range": tf.constant(range(5)).shape.as_list()}
images = tf.placeholder(tf.float32, [None, mnist.IMAGE_PIXELS])
labels = tf.placeholder(tf.int32, [None])
logits = mnist.inference(images, 16, 8)
loss = mnist.loss(logits, labels)
train_op = mnist.training(loss, 0.1)
correct = mnist.evaluation(logits, labels)
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    feed = {images: np.random.rand(4, 784), labels: [0, 1, 2, 3]}
    before = sess.run(loss, feed)
    for _ in range(20):
        sess.run(train_op, feed)
    out["learns"] = bool(sess.run(loss, feed) < before)
    out["correct"] = int(sess.run(correct, feed))
out["logits"] = logits.shape.as_list()
out["datasets"] = sorted(tf.contrib.learn.datasets.DATASETS)
try:
    tf.contrib.learn.datasets.DATASETS["iris"]
except ImportError as e:
    out["iris"] = str(e)
print("NAMES " + json.dumps(out))
'''


@pytest.mark.timeout(120)
def test_tf1_mode_has_the_names_public_tf1_scripts_use_beyond_compat_v1(tmp_path):
    r = run_tf1(tmp_path, NAMES)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("NAMES ", 1)[1])
    assert out["range"] == [5] and out["logits"] == [None, 10] and out["learns"] and 0 <= out["correct"] <= 4
    assert out["datasets"] == ["mnist"]
    assert "DATASETS['iris'] is gone" in out["iris"] and "only 'mnist' is covered" in out["iris"]


# A false duplicate in a queue runner's step: injected once beneath make_callable, in the runner's thread
# (the real one is about 1 in 43,000 steps; scripts/repro_request_twice.py reproduces it).
QUEUE_DUPLICATE = r'''
import threading
import tensorflow as tf
from tensorflow.python.client import session as session_lib

inner = session_lib.BaseSession._call_tf_sessionrun
failed = []

def _call(self, *args):
    if threading.current_thread().name.startswith("QueueRunnerThread") and not failed:
        failed.append(1)
        raise tf.errors.AbortedError(None, None, "The same RunGraph (Worker) request was received twice.")
    return inner(self, *args)

session_lib.BaseSession._call_tf_sessionrun = _call
server = tf.train.Server.create_local_server()
numbers = tf.train.input_producer(tf.constant(list(range(100)), tf.float32), shuffle=False)
batch = numbers.dequeue_many(4)
step = tf.assign_add(tf.train.get_or_create_global_step(), 1)
seen = 0
with tf.train.MonitoredTrainingSession(master=server.target, is_chief=True,
                                       hooks=[tf.train.StopAtStepHook(last_step=20)]) as sess:
    while not sess.should_stop():
        sess.run([step, batch])
        seen += 1
print("STEPS", seen, "FAILED", len(failed))
'''


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_false_duplicate_in_a_queue_runners_step_is_rerun_and_training_never_restarts(tmp_path):
    r = run_tf1(tmp_path, QUEUE_DUPLICATE)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "STEPS 20 FAILED 1" in r.stdout
    assert "TF rejected a step as a duplicate request although it was sent once" in r.stderr
    assert "MonitoredTrainingSession is recreating its session" not in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_non_chief_that_starts_after_its_chief_exited_still_ends_with_the_session_fixes(procs, tmp_path):
    script = os.path.join(LEGACY, "compat_v1_mts.py")
    cluster = Cluster.local(ps=1, workers=2, ports=procs.ports(3))
    spec = tmp_path / "c.json"
    spec.write_text(cluster.to_json())
    flags = ["--ps_hosts", cluster.jobs["ps"][0], "--worker_hosts", ",".join(cluster.jobs["worker"])]
    procs.cli("start", "--cluster", str(spec), "--job", "ps", "--task", "0", "--no-exit-when-done",
              env=base_env(**REUSE))
    host = procs.cli("start", "--cluster", str(spec), "--job", "worker", "--task", "1",    # worker:1's server only
                     env=base_env(**REUSE))
    chief = subprocess.run([PY, script, *flags, "--job_name", "worker", "--task_index", "0"],
                           env=base_env(**REUSE),
                           capture_output=True, text=True, timeout=120)
    assert chief.returncode == 0 and "worker 0: done" in chief.stdout, chief.stderr[-3000:]
    host.terminate()
    host.wait(10)
    time.sleep(0.5)
    # The chief trained to its last step and is gone: plain TF waits for it forever ("CreateSession still
    # waiting for response from worker: /job:worker/replica:0/task:0"); the fixes filter it out.
    late = subprocess.run(TF1 + ["--session-fixes-only", script, *flags, "--job_name", "worker", "--task_index", "1"],
                          env=base_env(), capture_output=True, text=True, timeout=90)
    assert late.returncode == 0 and "worker 1: done" in late.stdout, late.stderr[-3000:]


PRIVATE = r'''
import tensorflow as tf
w = tf.get_variable("w", [3])
step = tf.train.get_or_create_global_step()
train = tf.group(w.assign_add(tf.ones([3])), step.assign_add(1))
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    sess.run(train)
print("trained")
'''


# Logs before tf.app.run (TF's own handler only), then inside it (absl's handler on the root logger too).
LOGGING = r'''
import tensorflow as tf
tf.logging.set_verbosity(tf.logging.INFO)
tf.logging.info("before app.run")

def main(_):
    tf.logging.info("inside main")
    step = tf.assign_add(tf.train.get_or_create_global_step(), 1)
    hooks = [tf.train.StepCounterHook(every_n_steps=10), tf.train.StopAtStepHook(last_step=35)]
    with tf.train.MonitoredTrainingSession(hooks=hooks) as sess:
        while not sess.should_stop():
            sess.run(step)

tf.app.run()
'''
ABSL_LINE = r"^I\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] "


@pytest.mark.timeout(120)
def test_each_tf_logging_line_shows_once_in_tfs_format_or_in_absls_after_tf_app_run(tmp_path):
    r = run_tf1(tmp_path, LOGGING)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stderr.splitlines()

    def shown(message):
        return [line for line in lines if line.endswith(message)]
    assert shown("before app.run") == ["INFO:tensorflow:before app.run"]
    inside = shown("inside main")
    assert len(inside) == 1 and re.match(ABSL_LINE + "inside main$", inside[0]), inside
    rates = [line for line in lines if "global_step/sec: " in line]
    assert len(rates) >= 2 and all(re.match(ABSL_LINE + r"global_step/sec: [\d.]+$", line) for line in rates), rates
    assert len(shown("Graph was finalized.")) == 1


@pytest.mark.timeout(120)
def test_a_trainer_of_a_cluster_with_ps_that_trains_in_a_local_session_says_it_trains_a_private_copy(tmp_path):
    tf_config = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]},
                            "task": {"type": "worker", "index": 1}})
    r = run_tf1(tmp_path, PRIVATE, env=base_env(TF_CONFIG=tf_config))
    assert r.returncode == 0 and "trained" in r.stdout, r.stderr[-3000:]
    warnings = [line for line in r.stderr.splitlines() if "private copy" in line]
    assert len(warnings) == 1 and "worker:1 trains a private copy of its model" in warnings[0]
    assert "tf.train.replica_device_setter" in warnings[0]
    alone = run_tf1(tmp_path, PRIVATE)            # no cluster: nothing to say
    assert alone.returncode == 0 and "private copy" not in alone.stderr



SERVERS = r'''
import sys
import tensorflow as tf
worker, ps = sys.argv[1:3]
own = tf.ConfigProto(allow_soft_placement=True)
server = tf.train.Server({"worker": [f"localhost:{worker}"], "ps": [f"localhost:{ps}"]}, job_name="worker",
                         task_index=0, config=own)
spins = not server.server_def.default_session_config.experimental.disable_thread_spinning
print("server spins" if spins else "server sleeps", "program's config untouched" if own.experimental ==
      tf.ConfigProto().experimental else "program's config changed")
'''


@pytest.mark.timeout(120)
def test_a_programs_own_server_sleeps_instead_of_spinning_where_its_machine_runs_other_tasks(tmp_path, ports):
    # tfcluster local puts every task on one machine: a spinning thread of one task holds a core another needs.
    worker, ps = ports(2)
    r = run_tf1(tmp_path, SERVERS, worker, ps, env=base_env(**REUSE))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "server sleeps program's config untouched\n"

#: The interleaving that hung a slim chief once in a few runs: the Supervisor's checkpoint thread runs just after
#: the train thread's push and takes the step's wait; the train thread looks while that wait is still on.
TWO_LOOKS = r'''
import json
import threading
import time

import tensorflow as tf

from tfcluster.strategies import sync_replicas, sync_run

tf1 = tf.compat.v1
tf1.disable_eager_execution()
pushed, saver_finishing, finishes = threading.Event(), threading.Event(), []
real_finish, real_look = sync_run.SyncFinish.finish, sync_replicas._finish_pushes


def finish(self):               # the other thread's look takes the push; its wait is slow, as a wait for workers is
    finishes.append(threading.current_thread().name)
    saver_finishing.set()
    time.sleep(0.5)
    return real_finish(self)


def look(session):              # the train thread looks once the other thread is finishing its push
    if threading.current_thread().name == "train":
        pushed.set()
        saver_finishing.wait(10)
    return real_look(session)


sync_run.SyncFinish.finish, sync_replicas._finish_pushes = finish, look
w = tf1.get_variable("w", [], initializer=tf1.zeros_initializer())
gs = tf1.train.get_or_create_global_step()
opt = sync_replicas.SyncReplicasOptimizer(tf1.train.GradientDescentOptimizer(0.1), 1, 1, stall_warn_secs=1,
                                          stall_timeout_secs=5)
train = opt.minimize((w - 1.0) ** 2, global_step=gs)
out = {}
with tf1.Session() as sess:
    sess.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
    opt.make_session_run_hook(True).after_create_session(sess, None)

    def train_thread():
        sess.run(train)
        out["train thread sees"] = int(sess.run(gs))

    def saver_thread():
        pushed.wait(10)
        out["saver thread sees"] = int(sess.run(gs))
    threads = [threading.Thread(target=train_thread, name="train"), threading.Thread(target=saver_thread, name="saver")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for _ in range(3):
        sess.run(train)
    out["finishes"], out["global step"] = finishes, int(sess.run(gs))
print("OUT " + json.dumps(out))
'''


@pytest.mark.timeout(120)
def test_a_sync_push_is_finished_once_and_its_thread_returns_after_the_update_whichever_thread_looks_first(tmp_path):
    script = tmp_path / "two_looks.py"
    script.write_text(TWO_LOOKS)
    r = subprocess.run([PY, str(script)], capture_output=True, text=True, env=base_env(), timeout=100)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("OUT ", 1)[1])
    assert out["train thread sees"] == 1, out        # its step applied before its run returned
    assert out["finishes"] == ["saver", "MainThread", "MainThread", "MainThread"], out   # one wait per push
    assert out["global step"] == 4, out
