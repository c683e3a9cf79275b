"""TF1 mode: TF 1.x scripts run unchanged on TF 2.21, alone and as real local clusters.

The scripts under tests/legacy/ are written exactly as TF 1.x code was
(``import tensorflow as tf``, tf.app.flags, tf.contrib, the MNIST tutorial
reader), one per way of passing the cluster. The data is real: the UCI digits
shipped with scikit-learn, scaled up to MNIST's 28x28 and written as the four
MNIST IDX files (or as a CSV for the queue-runner script).
"""

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO, base_env, run_cli, run_local
from held_ports import REUSE
from test_tf1_gaps import run_tf1
from tfcluster.core.errors import DataError
from tfcluster.data import load_digits, write_idx
from tfcluster.core.errors import TfclusterError
from tfcluster.topology.ports import pick_free_ports
from tfcluster.tf1 import tf1_command
from tfcluster.tf1 import mnist as input_data

LEGACY = os.path.join(REPO, "tests", "legacy")
HAS_TF_KERAS = importlib.util.find_spec("tf_keras") is not None
needs_tf_keras = pytest.mark.skipif(
    not HAS_TF_KERAS, reason="tf.layers on TF 2.21 needs tf-keras: pip install tf-keras==2.21.0 "
                             "(or 'tfcluster[legacy]')")
TF1 = [sys.executable, "-m", "tfcluster.tf1"]


# ------------------------------------------------------------------- data
def _mnist_sized_digits(n, seed):
    """n 28x28 uint8 digit images: the 8x8 UCI digits scaled x3 at a random offset."""
    d = load_digits()
    rng = np.random.RandomState(seed)
    pick = rng.randint(0, len(d.y_train), n)
    big = np.kron(d.x_train[pick, :, :, 0], np.ones((3, 3), np.float32))       # (n, 24, 24)
    images = np.zeros((n, 28, 28), np.uint8)
    offsets = rng.randint(0, 5, (n, 2))
    for i, (dy, dx) in enumerate(offsets):
        images[i, dy:dy + 24, dx:dx + 24] = np.round(big[i] * 255)
    return images, d.y_train[pick].astype(np.uint8)


def write_mnist(directory, train=5600, test=400):
    """The four MNIST IDX .gz files of a small digits set; read_data_sets keeps 5000 for validation."""
    os.makedirs(directory, exist_ok=True)
    x, y = _mnist_sized_digits(train, seed=1)
    write_idx(os.path.join(directory, "train-images-idx3-ubyte.gz"), x)
    write_idx(os.path.join(directory, "train-labels-idx1-ubyte.gz"), y)
    x, y = _mnist_sized_digits(test, seed=2)
    write_idx(os.path.join(directory, "t10k-images-idx3-ubyte.gz"), x)
    write_idx(os.path.join(directory, "t10k-labels-idx1-ubyte.gz"), y)
    return directory


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    """A directory with the four MNIST IDX files (real digits at MNIST's size)."""
    return write_mnist(str(tmp_path_factory.mktemp("mnist")))


# --------------------------------------------------------- command rewrite
class TestCommandRewrite:
    def test_python_script_becomes_tf1_mode(self):
        assert tf1_command(["python", "train.py", "--x", "1"]) == \
            ["python", "-m", "tfcluster.tf1", "train.py", "--x", "1"]

    def test_interpreter_options_stay_before_the_runner(self):
        assert tf1_command([sys.executable, "-u", "-W", "ignore", "train.py"]) == \
            [sys.executable, "-u", "-W", "ignore", "-m", "tfcluster.tf1", "train.py"]

    def test_a_module_is_run_as_a_module(self):
        assert tf1_command(["python3.11", "-m", "pkg.train"]) == \
            ["python3.11", "-m", "tfcluster.tf1", "-m", "pkg.train"]

    def test_a_command_already_in_tf1_mode_is_left_alone(self):
        cmd = ["python", "-m", "tfcluster.tf1", "train.py"]
        assert tf1_command(cmd) == cmd

    @pytest.mark.parametrize("cmd, says", [
        (["bash", "run.sh"], "must be 'python script.py"),
        (["python", "-c", "print(1)"], "needs a script or '-m module'"),
        (["python"], "needs a script"),
        ([], "must be 'python script.py"),
    ])
    def test_anything_but_a_python_script_is_refused_in_one_line(self, cmd, says):
        with pytest.raises(TfclusterError, match=re.escape(says)):
            tf1_command(cmd)


# ------------------------------------------------------------ input_data
class TestInputData:
    def test_read_data_sets_gives_the_classic_splits_flattened_in_0_1(self, mnist_dir):
        ds = input_data.read_data_sets(mnist_dir)
        assert (ds.train.num_examples, ds.validation.num_examples, ds.test.num_examples) == (600, 5000, 400)
        assert ds.train.images.shape == (600, 784) and ds.train.images.dtype == np.float32
        assert 0.0 <= ds.train.images.min() and ds.train.images.max() <= 1.0 and ds.train.images.max() > 0.5
        assert ds.train.labels.shape == (600,) and set(np.unique(ds.train.labels)) <= set(range(10))

    def test_one_hot_labels_are_rows_with_a_single_one(self, mnist_dir):
        ds = input_data.read_data_sets(mnist_dir, one_hot=True, validation_size=100)
        assert ds.train.labels.shape == (5500, 10)
        assert np.all(ds.train.labels.sum(axis=1) == 1)

    def test_reshape_false_and_uint8_keep_the_raw_images(self, mnist_dir):
        ds = input_data.read_data_sets(mnist_dir, reshape=False, dtype="uint8", validation_size=0)
        assert ds.train.images.shape == (5600, 28, 28, 1) and ds.train.images.dtype == np.uint8
        assert ds.train.images.max() > 200

    def test_next_batch_wraps_an_epoch_with_the_rest_then_a_fresh_shuffle(self, mnist_dir):
        train = input_data.read_data_sets(mnist_dir, seed=3).train
        seen = [train.next_batch(256)[1] for _ in range(2)]    # 512 of 600
        assert train.epochs_completed == 0
        xs, ys = train.next_batch(256)                          # 88 left + 168 of epoch 2
        assert xs.shape == (256, 784) and ys.shape == (256,)
        assert train.epochs_completed == 1
        first_epoch = np.concatenate(seen + [ys[:88]])
        assert sorted(first_epoch) == sorted(input_data.read_data_sets(mnist_dir).train.labels)

    def test_the_same_seed_gives_the_same_batches(self, mnist_dir):
        a = input_data.read_data_sets(mnist_dir, seed=7).train.next_batch(20)[1]
        b = input_data.read_data_sets(mnist_dir, seed=7).train.next_batch(20)[1]
        assert np.array_equal(a, b)

    def test_a_validation_size_larger_than_the_train_set_is_refused_as_tf1_did(self, mnist_dir):
        with pytest.raises(ValueError, match="Validation size should be between 0 and 5600"):
            input_data.read_data_sets(mnist_dir, validation_size=6000)

    def test_no_files_says_which_files_to_put_where_and_never_downloads(self, tmp_path):
        with pytest.raises(DataError) as e:
            input_data.read_data_sets(str(tmp_path))
        msg = str(e.value)
        assert "\n" not in msg and str(tmp_path) in msg and "never downloads" in msg
        for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                  "t10k-labels-idx1-ubyte.gz"):
            assert f in msg

    def test_one_missing_file_is_named(self, mnist_dir, tmp_path):
        for f in os.listdir(mnist_dir):
            if not f.startswith("t10k-labels"):
                os.symlink(os.path.join(mnist_dir, f), tmp_path / f)
        with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte.gz in"):
            input_data.read_data_sets(str(tmp_path))


# ------------------------------------------------------ the runner, alone
PROBE = r'''
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops                      # submodules still import
import tensorflow.compat.v1 as tf_v1
from tensorflow.examples.tutorials.mnist import input_data
from tensorflow.contrib.layers import xavier_initializer, l2_regularizer, flatten
from tensorflow.contrib.learn.python.learn.datasets.mnist import read_data_sets

flags = tf.app.flags
flags.DEFINE_string("data_dir", "", "MNIST files")
FLAGS = flags.FLAGS
out = {}

def main(argv):
    out["argv"] = argv
    out["name"] = __name__
    out["eager"] = tf.executing_eagerly()
    out["is_v1"] = hasattr(tf, "placeholder") and hasattr(tf, "Session") and tf_v1.placeholder is tf.placeholder
    out["graph_cls"] = ops.Graph.__name__
    out["v2_still_there"] = hasattr(tf.compat.v2, "function")
    out["has"] = {n: hasattr(tf.train, n) for n in ("Supervisor", "SyncReplicasOptimizer", "Server",
                                                   "MonitoredTrainingSession", "replica_device_setter",
                                                   "string_input_producer", "shuffle_batch")}
    tf.logging.set_verbosity(tf.logging.INFO)
    out["mnist"] = read_data_sets(FLAGS.data_dir, one_hot=True).test.labels.shape[1]
    out["mnist_same"] = input_data.read_data_sets is tf.contrib.learn.datasets.mnist.read_data_sets
    gs = tf.contrib.framework.get_or_create_global_step()
    out["global_step_same"] = gs is tf.train.get_global_step() is tf.contrib.framework.get_or_create_global_step()
    w = tf.get_variable("w", [400, 600], initializer=xavier_initializer(seed=1))
    w_normal = tf.get_variable("wn", [400, 600], initializer=tf.contrib.layers.variance_scaling_initializer(seed=2))
    l2 = l2_regularizer(0.5)(tf.ones([3, 4]))
    l1 = tf.contrib.layers.l1_regularizer(0.25)(-tf.ones([2, 2]))
    l1l2 = tf.contrib.layers.l1_l2_regularizer(0.25, 0.5)(-tf.ones([2, 2]))
    flat = flatten(tf.zeros([5, 4, 3, 2]))
    out["flat_shape"] = flat.shape.as_list()
    out["scoped"] = [v.op.name for v in tf.contrib.framework.get_variables("w")]
    # contrib's streaming metrics take (predictions, labels): 3 of 4 right.
    acc, acc_update = tf.contrib.metrics.streaming_accuracy(tf.constant([1, 2, 3, 0]), tf.constant([1, 2, 3, 4]))
    batches = tf.contrib.data.Dataset.range(10).apply(tf.contrib.data.batch_and_drop_remainder(4))
    next_batch = batches.make_one_shot_iterator().get_next()
    with tf.Session() as sess:
        sess.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
        wv, wn, l2v, l1v, l1l2v = sess.run([w, w_normal, l2, l1, l1l2])
        sess.run(acc_update)
        out["accuracy"] = float(sess.run(acc))
        out["batches"] = [sess.run(next_batch).tolist() for _ in range(2)]
    out["l2"], out["l1"], out["l1l2"] = float(l2v), float(l1v), float(l1l2v)
    out["xavier_limit_ok"] = bool(abs(wv).max() <= np.sqrt(6.0 / 1000) + 1e-6)
    out["xavier_var"] = float(wv.var() * 1000 / 2)              # Glorot: var = 2 / (fan_in + fan_out)
    out["he_var"] = float(wn.var() * 400 / 2)                    # He: var = 2 / fan_in
    if "--layers" in sys.argv:
        out["dense"] = tf.layers.dense(tf.zeros([2, 3]), 4).shape.as_list()
        fc = tf.contrib.layers.fully_connected(tf.constant([[-1.0, -2.0, -3.0]]), 5,
                                               weights_initializer=tf.ones_initializer())
        cell = tf.contrib.rnn.BasicLSTMCell(6)
        outputs, _ = tf.contrib.rnn.static_rnn(cell, [tf.zeros([2, 3])] * 4, dtype=tf.float32)
        with tf.Session() as sess:
            sess.run(tf.global_variables_initializer())
            out["fc_relu"] = sess.run(fc).tolist()             # ReLU is contrib's default activation
        out["rnn"] = [len(outputs)] + outputs[-1].shape.as_list()
    print("PROBE " + json.dumps(out))

if __name__ == "__main__":
    tf.app.run()
'''


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_tf1_script_sees_tf_compat_v1_with_contrib_flags_and_mnist(tmp_path, mnist_dir):
    args = ["--data_dir", mnist_dir] + (["--layers"] if HAS_TF_KERAS else [])
    r = run_tf1(tmp_path, PROBE, *args, forked=False)     # as typed: what the script sees when nothing was imported
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("PROBE ", 1)[1])
    assert out["name"] == "__main__"
    assert out["argv"][0].endswith("script.py")                 # tf.app.run parsed our flags away
    assert out["eager"] is False and out["is_v1"] and out["graph_cls"] == "Graph"
    assert out["v2_still_there"]
    assert all(out["has"].values()), out["has"]
    assert out["mnist"] == 10 and out["mnist_same"] and out["global_step_same"]
    assert out["flat_shape"] == [5, 24]
    assert out["l2"] == pytest.approx(0.5 * 12 / 2) and out["l1"] == pytest.approx(0.25 * 4)
    assert out["l1l2"] == pytest.approx(0.25 * 4 + 0.5 * 4 / 2)
    assert out["scoped"] == ["w", "wn"]                           # a scope is a prefix, as in TF 1.x
    assert out["accuracy"] == pytest.approx(0.75)
    assert out["batches"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out["xavier_limit_ok"] and out["xavier_var"] == pytest.approx(1.0, rel=0.05)
    assert out["he_var"] == pytest.approx(1.0, rel=0.08)
    if HAS_TF_KERAS:
        assert out["dense"] == [2, 4]
        assert out["fc_relu"] == [[0.0] * 5]
        assert out["rnn"] == [4, 2, 6]


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("code, says", [
    ("tf.contrib.training.HParams(lr=0.1)",
     "tf.contrib.training.HParams is gone in TF 2.x; use a dict, argparse.Namespace or types.SimpleNamespace"),
    ("from tensorflow.contrib.layers import real_valued_column",
     "tf.contrib.layers.real_valued_column is gone in TF 2.x; use tf.feature_column.numeric_column"),
    ("from tensorflow.examples.tutorials.mnist import input_data\n"
     "input_data.read_data_sets('no-such-dir', one_hot=True)",
     "no MNIST data directory 'no-such-dir'"),
])
def test_what_tf2_lacks_is_one_line_naming_the_replacement_with_exit_2(tmp_path, code, says):
    r = run_tf1(tmp_path, "import tensorflow as tf\n" + code + "\n")
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [l for l in r.stderr.splitlines() if l.startswith("tfcluster: error:")]
    assert len(lines) == 1 and says in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_tf_layers_without_tf_keras_says_to_install_it(tmp_path):
    # TF_USE_LEGACY_KERAS=0 takes the path a machine without tf-keras takes: Keras 3's refusal.
    r = run_tf1(tmp_path, "import tensorflow as tf\ntf.layers.dense(tf.zeros([1, 2]), 3)\n",
                 env=base_env(TF_USE_LEGACY_KERAS="0"))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "tfcluster: error: tf.layers (dense) needs the tf-keras package on TF 2.21 (Keras 3 has no "
        "graph-mode layers): pip install tf-keras==2.21.0")


def test_the_runner_refuses_a_missing_script_in_one_line(tmp_path):
    r = subprocess.run(TF1 + [str(tmp_path / "nope.py")], capture_output=True, text=True, env=base_env(),
                       timeout=60)
    assert r.returncode == 2 and r.stderr == f"tfcluster: error: no such script: {tmp_path / 'nope.py'}\n"


ENDS = r'''
import atexit, sys, threading, time
import tensorflow as tf
atexit.register(lambda: print("ATEXIT ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.5), print("THREAD joined", flush=True))).start()
print("unflushed", end="")
how = sys.argv[1]
if how == "message":
    sys.exit("the data dir is empty")
if how == "raise":
    raise ValueError("no label column")
if how == "ctrl-c":
    raise KeyboardInterrupt
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize("forked, ends", [(True, ("ok", "message", "raise", "ctrl-c")), (False, ("raise",))],
                         ids=["forked", "started"])
def test_a_tf1_program_ends_as_python_ends_it_without_tearing_tensorflow_down(tmp_path, forked, ends):
    # TF1 mode leaves without the interpreter's 1.3-2 s teardown of TensorFlow (tfcluster/core/exits.py); all
    # else of Python's exit stays: threads joined, atexit handlers, streams flushed, the error and its code.
    for how in ends:
        r = run_tf1(tmp_path, ENDS, how, forked=forked)
        assert r.stdout.startswith("unflushed") and "THREAD joined" in r.stdout and "ATEXIT ran" in r.stdout, how
        code, err = {"ok": (0, ""), "message": (1, "the data dir is empty\n"), "raise": (1, "ValueError: no label"),
                     "ctrl-c": (-signal.SIGINT, "KeyboardInterrupt")}[how]
        assert r.returncode == code and err in r.stderr, (how, r.returncode, r.stderr[-2000:])


# ------------------------------------------- aborted steps (pitfalls item 15)
# TF's runtime fails the 5th training step once, with the error it would give. The
# false duplicate itself is too rare to wait for in a test (about 1 in 43,000 steps;
# scripts/repro_request_twice.py reproduces it), so it is injected beneath Session.run.
ABORTS = r'''
import json, tempfile
import tensorflow as tf
from tensorflow.python.client import session as session_lib

DUPLICATE = 'The same RunGraph (Worker) request was received twice. graph_handle: "1" step_id: 7'
OTHER = "Step aborted by a preempted ps (injected)"
server = tf.train.Server.create_local_server()
inner = session_lib.BaseSession._run
state = {}

def leaves(x):
    if isinstance(x, dict):
        return [l for v in x.values() for l in leaves(v)]
    if isinstance(x, (list, tuple)):
        return [l for v in x for l in leaves(v)]
    return [x]

def _run(self, handle, fetches, feed_dict, options, run_metadata):
    if any(f is state["op"] for f in leaves(fetches)):
        state["steps"] += 1
        if state["steps"] == 5 and not state["failed"]:
            state["failed"] = True
            raise tf.errors.AbortedError(None, None, state["message"])
    return inner(self, handle, fetches, feed_dict, options, run_metadata)

session_lib.BaseSession._run = _run

def train(message, checkpoint_dir=None):
    with tf.Graph().as_default():
        step = tf.assign_add(tf.contrib.framework.get_or_create_global_step(), 1)
        state.update(op=step, steps=0, failed=False, message=message)
        seen = []
        with tf.train.MonitoredTrainingSession(master=server.target, is_chief=True, checkpoint_dir=checkpoint_dir,
                                               save_checkpoint_steps=3 if checkpoint_dir else None,
                                               save_summaries_steps=None, save_summaries_secs=None,
                                               hooks=[tf.train.StopAtStepHook(last_step=8)]) as sess:
            while not sess.should_stop():
                seen.append(int(sess.run(step)))
        return seen

print("RESULT " + json.dumps({"duplicate": train(DUPLICATE), "no_checkpoint": train(OTHER),
                              "checkpoint": train(OTHER, tempfile.mkdtemp())}))
'''


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_false_duplicate_abort_is_retried_and_a_real_restart_says_what_it_throws_away(tmp_path):
    r = run_tf1(tmp_path, ABORTS)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = json.loads(r.stdout.split("RESULT ", 1)[1])
    # The false duplicate costs nothing: the step runs again, the global step never goes back.
    assert steps["duplicate"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert "tfcluster: warning: TF rejected a step as a duplicate request although it was sent once" in r.stderr
    # Any other abort is TF's recovery, unchanged, but no longer silent about what it loses.
    assert steps["no_checkpoint"] == [1, 2, 3, 4, 1, 2, 3, 4, 5, 6, 7, 8]
    assert "As chief with no checkpoint it re-initialises every variable: all training progress" in r.stderr
    assert steps["checkpoint"] == [1, 2, 3, 4, 4, 5, 6, 7, 8]
    assert re.search(r"As chief it restores \S+model\.ckpt-3 over its variables: every step since", r.stderr)
    assert r.stderr.count("MonitoredTrainingSession is recreating its session after AbortedError: Step aborted "
                          "by a preempted ps (injected).") == 2


# A queue runner still blocked when its MonitoredTrainingSession has joined the
# threads (SyncReplicasOptimizer's chief queue runner waits for gradients that
# never come) gets its step cancelled when the session closes.
LATE_QUEUE_RUNNER = r'''
import time
import tensorflow as tf
never_fed = tf.FIFOQueue(1, tf.int32)
tokens = tf.FIFOQueue(1, tf.int32)
runner = tf.train.QueueRunner(tokens, [tokens.enqueue(never_fed.dequeue())])
coord = tf.train.Coordinator()
sess = tf.Session()
threads = runner.create_threads(sess, coord=coord, start=True)
time.sleep(1.0)  # the runner is now blocked in its step (a stop asked earlier ends it cleanly)
coord.request_stop()
coord.join(threads, stop_grace_period_secs=0.2, ignore_live_threads=True)
sess.close()
for t in threads:
    t.join(10)
print("late threads alive:", sum(t.is_alive() for t in threads))
'''


@pytest.mark.timeout(120)
def test_a_queue_runner_cancelled_after_its_coordinator_joined_ends_without_a_traceback(tmp_path):
    r = run_tf1(tmp_path, LATE_QUEUE_RUNNER)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "late threads alive: 0\n"
    assert "Exception in thread" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


# ------------------------------------------- launcher options for legacy scripts
@pytest.mark.parametrize("args, says", [
    (["--cluster", "c.json", "--ports", "1,2,3"], "give --cluster FILE or --ports LIST, not both"),
    (["--cluster", "c.json", "--workers", "2"], "--cluster c.json already says how many tasks there are; drop "
                                                "--workers"),
    (["--cluster", "remote.json"], "ps:0 is at 10.9.8.7:2222, not on this machine"),
    (["--ports", "2222,x"], "--ports: '2222,x' is not a comma-separated list of port numbers"),
    (["--ps", "1", "--workers", "2", "--ports", "2222,2223"], "3 task(s) need 3 ports, got 2"),
    (["--join-grace", "-1"], "--join-grace must be >= 0 seconds"),
    (["--tf1", "--", "bash", "train.sh"], "--tf1 runs Python scripts"),
])
def test_local_refuses_a_bad_legacy_option_in_one_line_and_starts_nothing(tmp_path, args, says):
    (tmp_path / "c.json").write_text(json.dumps({"ps": ["localhost:2222"], "worker": ["localhost:2223"]}))
    (tmp_path / "remote.json").write_text(json.dumps({"ps": ["10.9.8.7:2222"], "worker": ["localhost:2223"]}))
    if "--" not in args:
        args = args + ["--", "python", "train.py"]
    r = run_cli("local", *args, cwd=str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("tfcluster: error: ") and says in r.stderr, r.stderr
    assert r.stdout == "" and not (tmp_path / "tfcluster-logs").exists()


def test_local_refuses_an_explicit_port_that_is_taken_and_names_it(tmp_path):
    (tmp_path / "train.py").write_text("")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        free = pick_free_ports(1)[0]
        # Isolated, the cluster has a port space of its own where this port is free: no clash to refuse.
        r = run_cli("local", "--no-isolate", "--ps", "1", "--workers", "1", "--ports", f"{free},{port}",
                    "--log-dir", tmp_path / "logs", "--", "python", "train.py", cwd=str(tmp_path))
    assert r.returncode == 2
    assert f"tfcluster: error: port {port} of ps:0 (localhost:{port}) is already in use" in r.stderr
    assert "started" not in r.stdout


# ------------------------------------------------- clusters, one per style
def _losses(output, prefix):
    """The loss values a task printed, in order."""
    return [float(m) for m in re.findall(re.escape(prefix) + r".*loss (\d+\.\d+)", output)]


def assert_falls(losses, what):
    assert len(losses) >= 3, f"{what}: too few loss lines to judge: {losses}"
    k = max(1, len(losses) // 3)
    first, last = np.mean(losses[:k]), np.mean(losses[-k:])
    assert last < 0.7 * first, f"{what}: loss did not fall: {losses}"


@pytest.mark.slow
@pytest.mark.timeout(280)
@needs_tf_keras
def test_four_flags_script_trains_async_with_tf_layers_and_the_ps_is_ended(tmp_path, mnist_dir):
    code, out = run_local(tmp_path, "--tf1", "--ps", "1", "--workers", "2", "--legacy-flags=all", "--",
                          "python", os.path.join(LEGACY, "four_flags.py"), "--data_dir", mnist_dir,
                          "--train_steps", "150")
    assert code == 0, out[-4000:]
    assert "[worker:0] worker 0: done" in out and "[worker:1] worker 1: done" in out
    assert "stopping ps:0" in out                              # its server.join() never returns
    assert_falls(_losses(out, "[worker:0]"), "worker 0")


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_two_flag_script_with_hard_coded_ports_runs_in_graph_and_joined_workers_are_ended(tmp_path, mnist_dir,
                                                                                           ports):
    ps, w0, w1 = ports(3)
    with open(os.path.join(LEGACY, "hardcoded_ingraph.py")) as f:
        text = f.read()
    for marker, value in (("__PS_PORT__", ps), ("__WORKER0_PORT__", w0), ("__WORKER1_PORT__", w1),
                          ("__DATA_DIR__", mnist_dir)):
        text = text.replace(marker, str(value))
    script = tmp_path / "hardcoded_ingraph.py"
    script.write_text(text)
    code, out = run_local(tmp_path, "--tf1", "--ps", "1", "--workers", "2", "--ports", f"{w0},{w1},{ps}",
                          "--legacy-flags=job-task", "--join-grace", "2", "--", "python", script)
    assert code == 0, out[-4000:]
    assert f"worker:0 localhost:{w0}" in out and f"ps:0 localhost:{ps}" in out
    assert "[worker:0] chief done at step" in out
    assert "taken to be left in server.join()" in out           # worker 1 never leaves its join
    assert_falls(_losses(out, "[worker:0]"), "chief")


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_tf_config_script_with_a_chief_trains_in_sync_and_both_replicas_leave(tmp_path, mnist_dir):
    code, out = run_local(tmp_path, "--tf1", "--ps", "1", "--workers", "1", "--chief", "--",
                          "python", os.path.join(LEGACY, "tfconfig_sync.py"), mnist_dir)
    assert code == 0, out[-4000:]
    assert "[chief:0] chief 0: done" in out and "[worker:0] worker 0: done" in out, out[-3000:]
    assert "Exception in thread" not in out, out[-3000:]    # the chief queue runner ends quietly
    assert_falls(_losses(out, "[chief:0]"), "chief")


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_queue_runner_input_trains_from_a_csv_through_shuffle_batch(tmp_path):
    d = load_digits()
    rows = np.column_stack([d.y_train, d.x_train.reshape(len(d.y_train), -1)])
    csv = tmp_path / "digits.csv"
    np.savetxt(csv, rows, fmt=["%d"] + ["%.4f"] * 64, delimiter=",")
    code, out = run_local(tmp_path, "--tf1", "--ps", "1", "--workers", "1", "--",
                          "python", os.path.join(LEGACY, "queue_input.py"), "--train_csv", csv)
    assert code == 0, out[-4000:]
    assert "[worker:0] worker 0: done" in out
    assert_falls(_losses(out, "[worker:0]"), "worker 0")


@pytest.mark.slow
@pytest.mark.timeout(280)
def test_a_script_that_never_stops_is_ended_by_the_timeout_with_exit_124(tmp_path, mnist_dir, ports):
    ps, worker = ports(2)
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps({"ps": [f"localhost:{ps}"], "worker": [f"localhost:{worker}"]}))
    code, out = run_local(tmp_path, "--tf1", "--cluster", spec, "--legacy-flags=all",
                          # Counted from before the tasks start; forked from one import, they train within ~10 s.
                          "--timeout", "25", "--", "python", os.path.join(LEGACY, "never_stops.py"),
                          "--data_dir", mnist_dir)
    assert code == 124, out[-4000:]
    assert f"--ps_hosts=localhost:{ps} --worker_hosts=localhost:{worker}" in out
    assert "timed out after 25s (--timeout); stopping the cluster" in out
    assert_falls(_losses(out, "[worker:0]"), "worker 0")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_start_tf1_runs_a_worker_in_tf1_mode_beside_a_hosted_ps(procs, tmp_path, mnist_dir):
    ps, w0 = procs.ports(2)
    spec = tmp_path / "cluster.json"
    spec.write_text(json.dumps({"ps": [f"localhost:{ps}"], "worker": [f"localhost:{w0}"]}))
    ps_proc = procs.cli("start", "--cluster", spec, "--job", "ps", "--task", "0", env=base_env(**REUSE))
    worker = procs.cli("start", "--tf1", "--cluster", spec, "--job", "worker", "--task", "0",
                       "--legacy-flags=all", "--", "python", os.path.join(LEGACY, "never_stops.py"),
                       "--data_dir", mnist_dir, env=base_env(**REUSE))
    lines = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and len(_losses("\n".join(lines), "")) < 4:
        line = worker.stdout.readline()
        if not line:
            break
        lines.append(line)
    worker.terminate()
    assert worker.wait(30) is not None
    assert_falls(_losses("".join(lines), ""), "worker started by tfcluster start --tf1")
    ps_proc.terminate()
    assert ps_proc.wait(30) == 0
