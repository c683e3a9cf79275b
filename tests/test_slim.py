"""tf.contrib.slim programs under TF1 mode, unchanged: served by the tf-slim package, in one process and on a cluster.

tests/legacy/slim_train.py is slim's train/eval_image_classifier.py made small:
slim layers in an arg_scope, ``slim.learning.train`` (a Supervisor), async or
with ``sync_optimizer=SyncReplicasOptimizer``, model_deploy-style clones, and
``slim.evaluation.evaluation_loop`` as the evaluator task.
"""

import json
import os
import re
import sys

import pytest

import forks
from conftest import REPO, base_env, run_local

SLIM_TRAIN = os.path.join(REPO, "tests", "legacy", "slim_train.py")
SLIM_TFRECORDS = os.path.join(REPO, "tests", "legacy", "slim_tfrecords.py")
TF1 = [sys.executable, "-m", "tfcluster.tf1"]
#: What a clean run never prints: a traceback, TF's warnings about what slim's Supervisor does twice.
NOISE = ("Traceback", "closed FileWriter", "Issue encountered when serializing", "layer.apply")


def _tf1(tmp_path, *args, env=None, timeout=120):
    return forks.run(TF1 + list(args), env or base_env(), cwd=tmp_path, timeout=timeout)


def _steps(out):
    """``{"worker 0": local steps, ...}`` from the program's closing lines."""
    return {t: int(n) for t, n in re.findall(r"(\w+ \d+): done after (\d+) local steps", out)}


def _checkpoint_step(train_dir):
    import tensorflow as tf
    return int(tf.train.load_variable(tf.train.latest_checkpoint(str(train_dir)), "global_step"))


def run_slim(tmp_path, cluster, *args):
    """slim_train.py under ``tfcluster local --tf1 CLUSTER``, to a clean exit; the launcher's output.

    The launcher's own timeout ends a run that hangs before pytest's does, so a failure shows what each task said.
    """
    code, out = run_local(tmp_path, "--tf1", "--timeout", 180, *cluster, "--", "python", SLIM_TRAIN, "--train_dir",
                          tmp_path / "train", *args)
    assert code == 0, out[-4000:]
    return out


def assert_quiet(out):
    for noise in NOISE:
        assert noise not in out, out[-3000:]


# ------------------------------------------------------------------ the names
PROBE = r'''
import importlib
import json
import tensorflow as tf
import tensorflow.contrib.slim as slim_imported
from tensorflow.contrib import slim
from tensorflow.contrib.slim.nets import resnet_v1
from tensorflow.contrib.slim.python.slim import learning
from tensorflow.contrib.framework import arg_scope, add_arg_scope
from tensorflow.contrib.layers.python.layers import initializers
import tf_slim

out = {
    "slim": slim is tf_slim and slim_imported is tf_slim and tf.contrib.slim is tf_slim,
    "nets": resnet_v1 is tf_slim.nets.resnet_v1,
    "learning": learning is tf_slim.learning,
    "arg_scope": arg_scope is tf_slim.arg_scope and add_arg_scope is tf_slim.add_arg_scope,
    "layers": [getattr(tf.contrib.layers, n) is getattr(tf_slim, n)
               for n in ("conv2d", "batch_norm", "fully_connected", "max_pool2d", "xavier_initializer",
                         "l2_regularizer", "optimize_loss", "layer_norm", "flatten")],
    "initializers": initializers.xavier_initializer is tf_slim.xavier_initializer,
    "training": (tf.contrib.training.create_train_op
                 is importlib.import_module("tf_slim.training.training").create_train_op),
    "losses": tf.contrib.losses.softmax_cross_entropy is tf_slim.losses.softmax_cross_entropy,
    "global_step": tf.contrib.framework.get_or_create_global_step is tf.train.get_or_create_global_step,
    "spec": tf_slim.__spec__.name,
}
with slim.arg_scope([slim.conv2d], padding="SAME", weights_regularizer=slim.l2_regularizer(0.1)):
    net = slim.conv2d(tf.zeros([2, 8, 8, 3]), 4, [3, 3], scope="conv1")
    net = slim.max_pool2d(net, [2, 2], scope="pool1")
    net = slim.batch_norm(slim.flatten(net), is_training=True)
out["shape"] = net.shape.as_list()
# The paths that name TF internals TF 2.16 moved (tf1/slim.py MOVED): batch norm without fusing, a local
# variable, clipped and summarized gradients, a streaming metric.
plain = slim.batch_norm(tf.zeros([4, 3]), fused=False, is_training=True, scope="plain")
counter = slim.local_variable(tf.zeros([2]), name="counter")
loss = tf.reduce_mean(tf.square(net)) + tf.reduce_mean(plain)
train_op = slim.learning.create_train_op(loss, tf.train.GradientDescentOptimizer(0.1), clip_gradient_norm=1.0,
                                         summarize_gradients=True)
accuracy, update = slim.metrics.streaming_accuracy(tf.constant([1, 0]), tf.constant([1, 1]))
with tf.Session() as session:
    session.run([tf.global_variables_initializer(), tf.local_variables_initializer()])
    out["trained"] = float(session.run(train_op))
    session.run(update)
    out["accuracy"] = float(session.run(accuracy))
out["local"] = counter.op.name in [v.op.name for v in tf.local_variables()]
out["variables"] = sorted(v.op.name for v in slim.get_model_variables())
out["regularized"] = len(tf.losses.get_regularization_losses())
print("PROBE " + json.dumps(out))
'''


@pytest.mark.timeout(120)
def test_tf_contrib_slim_and_its_kin_are_the_tf_slim_package(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    r = _tf1(tmp_path, "probe.py")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.split("PROBE ", 1)[1])
    assert out["slim"] and out["nets"] and out["learning"] and out["arg_scope"] and out["initializers"]
    assert all(out["layers"]), out["layers"]
    assert out["training"] and out["losses"] and out["global_step"]
    assert out["spec"] == "tf_slim"                  # imported under TF 1.x's name, it keeps its own
    assert out["shape"] == [2, 64]                   # SAME from the arg_scope, then a 2x2 pool
    # TF 1.x's names, so TF 1.x checkpoints restore by name
    assert out["variables"] == ["BatchNorm/beta", "BatchNorm/moving_mean", "BatchNorm/moving_variance",
                                "conv1/biases", "conv1/weights", "plain/beta", "plain/moving_mean",
                                "plain/moving_variance"]
    assert out["regularized"] == 1
    assert out["trained"] >= 0 and out["accuracy"] == 0.5 and out["local"]


def test_the_tf_internals_tf_slim_names_are_put_back_as_tfs_own_objects():
    import importlib
    from tfcluster.tf1 import slim
    slim.restore_moved_names()
    for module, name, home in slim.MOVED:
        home, _, attr = home.partition(":")
        assert getattr(importlib.import_module(module), name) is getattr(importlib.import_module(home), attr or name)
    normalization = importlib.import_module("tensorflow.python.layers.normalization")
    assert normalization.BatchNormalization.__module__ == slim.NORMALIZATION[1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("code, says", [
    ("tf.contrib.layers.sparse_column_with_hash_bucket('a', 10)",
     "tf.contrib.layers.sparse_column_with_hash_bucket is gone in TF 2.x; use "
     "tf.feature_column.categorical_column_with_hash_bucket"),
    ("tf.contrib.framework.no_such_thing",
     "tf.contrib.framework.no_such_thing is gone in TF 2.x; use its TF 2 replacement"),
])
def test_what_tf_slim_lacks_is_one_line_naming_the_replacement(tmp_path, code, says):
    (tmp_path / "script.py").write_text("import tensorflow as tf\n" + code + "\n")
    r = _tf1(tmp_path, "script.py")
    assert r.returncode == 2, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("tfcluster: error:")]
    assert len(lines) == 1 and says in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr


@pytest.mark.timeout(120)
def test_without_tf_slim_a_slim_program_says_to_install_the_legacy_extra(tmp_path):
    # Where tf-slim is not installed, importing it fails as below.
    absent = tmp_path / "absent"
    absent.mkdir()
    (absent / "tf_slim.py").write_text("raise ModuleNotFoundError(\"No module named 'tf_slim'\", name='tf_slim')\n")
    (tmp_path / "script.py").write_text("import tensorflow as tf\nslim = tf.contrib.slim\n")
    env = base_env()
    env["PYTHONPATH"] = str(absent) + os.pathsep + env["PYTHONPATH"]
    r = _tf1(tmp_path, "script.py", env=env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.count("tfcluster: error:") == 1 and "Traceback" not in r.stderr
    assert ("tfcluster: error: tf.contrib.slim comes from the tf-slim package in TF1 mode, which is not installed: "
            "pip install 'tfcluster[legacy]'") in r.stderr


def write_png_tfrecords(path, n):
    """``n`` examples the way slim's dataset scripts write them: a PNG, its format, its class."""
    import numpy as np
    import tensorflow as tf
    rng = np.random.RandomState(0)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(n):
            png = tf.io.encode_png(rng.randint(0, 255, (32, 32, 3)).astype(np.uint8)).numpy()
            feature = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                       "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"png"])),
                       "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_slims_tfrecord_input_feeds_a_slim_net_that_trains_and_evaluates(tmp_path):
    write_png_tfrecords(tmp_path / "images.tfrecord", 20)
    r = _tf1(tmp_path, SLIM_TFRECORDS, "--dataset_dir", tmp_path / "images.tfrecord", "--train_dir",
             tmp_path / "train", timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"trained 3 steps, final loss \d+\.\d+", r.stdout), r.stdout[-2000:]
    accuracy, recall = map(float, re.search(r"evaluated: accuracy ([\d.]+) recall@5 ([\d.]+)", r.stdout).groups())
    assert 0 <= accuracy <= recall <= 1
    assert _checkpoint_step(tmp_path / "train") == 3
    assert_quiet(r.stdout + r.stderr)


# --------------------------------------------------------------- the program
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_slim_program_trains_in_one_process_and_checkpoints_under_tf1_names(tmp_path):
    r = _tf1(tmp_path, SLIM_TRAIN, "--train_dir", tmp_path / "train", "--max_number_of_steps", 100)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _steps(r.stdout) == {"worker 0": 100}
    assert _checkpoint_step(tmp_path / "train") == 100
    import tensorflow as tf
    names = dict(tf.train.list_variables(str(tmp_path / "train")))
    assert names["fc1/weights"] == [8, 32] and names["logits/biases"] == [2]
    assert_quiet(r.stdout + r.stderr)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_slim_async_on_a_cluster_trains_one_shared_model_and_slims_evaluator_follows_it(tmp_path, reliability):
    out = run_slim(tmp_path, ["--ps", "1", "--workers", "2", "--evaluator", "--legacy-flags=all"],
                   "--max_number_of_steps", "300")
    steps = _steps(out)
    # One shared global step: the two workers' steps add up to the target (a last racing step may overshoot).
    assert set(steps) == {"worker 0", "worker 1"} and min(steps.values()) > 0, steps
    assert 300 <= sum(steps.values()) <= 302, steps
    assert _checkpoint_step(tmp_path / "train") >= 300
    first = {int(w): float(t) for w, t in re.findall(r"worker (\d+): first step at ([\d.]+)", out)}
    reliability("slim async: seconds between the chief's first step and the non-chief's", first[1] - first[0], "s")
    assert first[1] - first[0] < 5.0, first           # not Supervisor's 30 s readiness poll
    final = re.findall(r"evaluator: global step (\d+) accuracy ([\d.]+)", out)
    assert final and int(final[-1][0]) >= 300 and float(final[-1][1]) > 0.9, out[-3000:]
    assert "[tfcluster] evaluator:0 exited with code 0" in out
    assert "stopping ps:0" in out                      # its server.join() never returns
    assert_quiet(out)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_slim_sync_replicas_from_tf_config_takes_one_gradient_from_each_trainer_per_step(tmp_path):
    out = run_slim(tmp_path, ["--ps", "1", "--chief", "--workers", "1"], "--max_number_of_steps", "150",
                   "--sync_replicas")
    assert _steps(out) == {"chief 0": 150, "worker 0": 150}      # each trainer pushed once per global step
    assert _checkpoint_step(tmp_path / "train") == 150
    assert_quiet(out)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_model_deploy_clones_keep_their_variables_on_the_ps_and_the_chief_reports_where(tmp_path):
    out = run_slim(tmp_path, ["--ps", "2", "--workers", "1", "--legacy-flags=all"], "--max_number_of_steps", "60",
                   "--num_clones", "2")
    assert _steps(out) == {"worker 0": 60}
    # model_deploy deals Variable ops to the ps tasks in turn: every weight on ps:0, every bias on ps:1
    # (8x32 + 32x16 + 16x2 floats and the global step: 3208 B; 32 + 16 + 2 floats: 200 B), none on the worker.
    assert ("worker:0 placed 7 variable(s): /job:ps/task:0 3.1 KB, /job:ps/task:1 200 B (ps imbalance 88.3%)"
            in out), out[-3000:]
    assert_quiet(out)
