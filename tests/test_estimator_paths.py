"""The Estimator's other import names: in TF1 mode each is tfcluster's Estimator, as ``tf.estimator`` is.

- ``import tensorflow_estimator`` (its ``estimator``, its generated ``_api.v1`` / ``python.estimator.api._v1``
  modules), ``tf.compat.v1.estimator``, ``tf.compat.v2.estimator`` and ``import tensorflow.compat.v1 as tf;
  tf.estimator`` are ``tf.estimator`` itself;
- ``tensorflow_estimator.python.estimator.*`` and TF 1.13's ``tensorflow.python.estimator.*`` are the package's own
  modules on tfcluster's Estimator: the classes a program hands the Estimator are ``tf.estimator``'s, the canned
  classes subclass it, and a program written against those paths trains;
- a module of the package that does not load on TF 2.21 (the TPU estimator) is one line, exit 2;
- outside TF1 mode, a task that dies of the Estimator's absence gets the launcher's hint to run it with ``--tf1``.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import base_env
from tfcluster.launch.output import failure_cause

SAME = """
import tensorflow as tf
import tensorflow_estimator as tf_estimator
from tensorflow_estimator.python.estimator import run_config as run_config_lib
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator.canned import dnn
from tensorflow_estimator.python.estimator.training import TrainSpec, train_and_evaluate
from tensorflow_estimator.python.estimator.inputs import numpy_io
from tensorflow.python.estimator import estimator as old_estimator
from tensorflow_estimator.python.estimator.api._v1 import estimator as api_v1
from tensorflow_estimator._api.v2 import estimator as api_v2
import tensorflow.compat.v1 as tf1
same = {
    "tensorflow_estimator.estimator": tf_estimator.estimator is tf.estimator,
    "api._v1.estimator": api_v1 is tf.estimator,
    "_api.v2.estimator": api_v2 is tf.estimator,
    "tf.compat.v1.estimator": tf.compat.v1.estimator is tf.estimator,
    "tf.compat.v2.estimator": tf.compat.v2.estimator is tf.estimator,
    "tensorflow.compat.v1's estimator": tf1.estimator is tf.estimator,
    "run_config.RunConfig": run_config_lib.RunConfig is tf.estimator.RunConfig,
    "training.TrainSpec": TrainSpec is tf.estimator.TrainSpec,
    "training.train_and_evaluate": train_and_evaluate is tf.estimator.train_and_evaluate,
    "numpy_io.numpy_input_fn": numpy_io.numpy_input_fn is tf.estimator.inputs.numpy_input_fn,
    "canned.dnn.DNNClassifier on tfcluster's": issubclass(dnn.DNNClassifier, tf.estimator.Estimator),
    "tensorflow.python.estimator.estimator": issubclass(old_estimator.Estimator, tf.estimator.Estimator),
    "model_fn.ModeKeys": model_fn_lib.ModeKeys.TRAIN == tf.estimator.ModeKeys.TRAIN,
}
for name, ok in same.items():
    print(name, ok)
"""

#: A model_fn program written against tensorflow_estimator's module paths, as libraries of that era import them.
TRAINS = """
import sys
import numpy as np
import tensorflow as tf
from tensorflow_estimator.python.estimator import estimator as estimator_lib
from tensorflow_estimator.python.estimator import model_fn as model_fn_lib
from tensorflow_estimator.python.estimator import run_config as run_config_lib
from tensorflow_estimator.python.estimator.inputs import numpy_io

def model_fn(features, labels, mode):
    logits = tf.layers.dense(features["x"], 2)
    loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss, tf.train.get_or_create_global_step())
    return model_fn_lib.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"logits": logits})

x = np.random.RandomState(0).rand(64, 3).astype("float32")
y = (x.sum(axis=1) > 1.5).astype("int32")
estimator = estimator_lib.Estimator(model_fn, config=run_config_lib.RunConfig(model_dir=sys.argv[1]))
estimator.train(numpy_io.numpy_input_fn({"x": x}, y, batch_size=16, num_epochs=None, shuffle=True), steps=20)
print("trained to step", estimator.get_variable_value("global_step"))
"""


def tf1_mode(tmp_path, source, *args):
    script = tmp_path / "program.py"
    script.write_text(source)
    return subprocess.run([sys.executable, "-m", "tfcluster.tf1", str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=150, env=base_env())


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_every_import_name_of_the_estimator_is_tfclusters_in_tf1_mode(tmp_path):
    r = tf1_mode(tmp_path, SAME)
    assert r.returncode == 0, r.stderr[-3000:]
    answers = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines() if line.endswith((" True", " False")))
    assert len(answers) == 13 and set(answers.values()) == {"True"}, answers


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_model_fn_program_written_against_tensorflow_estimators_modules_trains_in_tf1_mode(tmp_path):
    r = tf1_mode(tmp_path, TRAINS, tmp_path / "model")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained to step 20" in r.stdout, r.stdout[-2000:]
    assert any(name.startswith("model.ckpt-20") for name in os.listdir(tmp_path / "model"))


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_module_of_the_package_that_does_not_load_on_tf_2_21_is_one_line(tmp_path):
    r = tf1_mode(tmp_path, "from tensorflow_estimator.python.estimator.tpu import tpu_estimator\n")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert re.search(r"^tfcluster: error: .*tensorflow_estimator\.python\.estimator\.tpu\.tpu_estimator", r.stderr,
                     re.M), r.stderr[-3000:]


def test_a_task_that_dies_of_the_estimators_absence_gets_the_hint_to_run_it_in_tf1_mode():
    for last in ("ImportError: cannot import name 'estimator_training' from 'tensorflow.python.distribute' (/x.py)",
                 "AttributeError: module 'tensorflow' has no attribute 'estimator'"):
        cause = failure_cause(["Traceback (most recent call last):", '  File "train.py", line 3', last])
        assert cause.startswith(last) and cause.endswith("run it in TF1 mode (--tf1), where tf.estimator and "
                                                         "tensorflow_estimator are tfcluster's Estimator"), cause
    assert failure_cause(["ValueError: bad"]) == "ValueError: bad"
