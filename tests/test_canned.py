"""TF 1.x's canned estimators over feature columns run unchanged under TF1 mode, in one process and on a cluster.

They are tensorflow-estimator 2.15's own classes and heads on tfcluster's Estimator (tfcluster/estimator/canned.py),
so their variable names, metrics, prediction keys and export signatures are TF 1.x's; the program is
tests/programs/canned.py.
"""

import json
import re

import pytest

from conftest import base_env, data_files
from test_tf1_gaps import run_tf1

# The *Estimator classes take tf.contrib.estimator's (v1) heads, as TF 1.x's did, or a v2 head (name+head).
CLASSIFIERS = ["DNNClassifier", "DNNEstimator", "LinearClassifier", "DNNLinearCombinedClassifier",
               "DNNLinearCombinedEstimator", "BaselineClassifier", "BaselineEstimator", "DNNEstimator+BinaryClassHead"]
REGRESSORS = ["DNNRegressor", "LinearRegressor", "LinearEstimator", "DNNLinearCombinedRegressor", "BaselineRegressor",
              "LinearEstimator+RegressionHead", "DNNLinearCombinedEstimator+PoissonRegressionHead"]
#: The twelve canned estimator classes of TF 1.x's tf.estimator.
CLASSES = [f"{family}{kind}" for family in ("DNN", "Linear", "DNNLinearCombined", "Baseline")
           for kind in ("Classifier", "Regressor", "Estimator")]
#: TF 1.x's eval metric names of a binary classifier (a multi-class head has no auc, precision or recall).
BINARY_METRICS = {"accuracy", "accuracy_baseline", "auc", "auc_precision_recall", "average_loss", "label/mean",
                  "prediction/mean", "precision", "recall", "loss", "global_step"}
FIRST_VARIABLE = {"DNN": "dnn/hiddenlayer_0/kernel", "Linear": "linear/linear_model/education/weights",
                  "Baseline": "baseline/bias"}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Every canned estimator class trained 100 steps, evaluated, asked to predict, exported and served."""
    tmp = tmp_path_factory.mktemp("canned")
    program = (__import__("pathlib").Path(__file__).parent / "programs" / "canned.py").read_text()
    r = run_tf1(tmp, program, "--model_dir", tmp / "models", "--export", "--estimator", *CLASSIFIERS, *REGRESSORS,
                timeout=420)
    assert r.returncode == 0, r.stderr[-3000:]
    return {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^RESULT (\S+) (.*)$", r.stdout, re.M)}


@pytest.mark.timeout(450)
@pytest.mark.parametrize("name", CLASSIFIERS)
def test_a_canned_classifier_trains_evaluates_predicts_and_serves_tf_examples_as_tf_1x_did(one_process, name):
    result = one_process[name]
    metrics, prediction, serving = result["metrics"], result["prediction"], result["serving"]
    multi_class = name == "DNNLinearCombinedEstimator"       # tf.contrib.estimator.multi_class_head(3)
    expected = BINARY_METRICS - ({"accuracy_baseline", "auc", "auc_precision_recall", "label/mean",
                                  "prediction/mean", "precision", "recall"} if multi_class else set())
    assert set(metrics) == expected
    assert metrics["global_step"] == 100
    keys = {"logits", "probabilities", "class_ids", "classes", "all_class_ids", "all_classes"}
    assert set(prediction) == keys | (set() if multi_class else {"logistic"})
    if not name.startswith("Baseline"):      # a baseline predicts the label mean: nothing to learn beyond it
        assert metrics["accuracy"] > 0.75, metrics
    assert FIRST_VARIABLE[re.match(r"DNN|Linear|Baseline", name).group(0)] in result["variables"]
    # TF 1.x's choice for a classifier served from tf.Example strings: classification as serving_default.
    assert serving["method"] == "tensorflow/serving/classify"
    assert {"serving_default", "classification", "predict"} <= set(serving["signatures"])
    assert len(serving["outputs"]["scores"]) == 2 and serving["outputs"]["classes"][0][:2] == ["0", "1"]


@pytest.mark.timeout(450)
@pytest.mark.parametrize("name", REGRESSORS)
def test_a_canned_regressor_trains_evaluates_predicts_and_serves_tf_examples_as_tf_1x_did(one_process, name):
    result = one_process[name]
    metrics, serving = result["metrics"], result["serving"]
    assert set(metrics) >= {"average_loss", "label/mean", "prediction/mean", "loss", "global_step"}
    assert metrics["global_step"] == 100
    assert set(result["prediction"]) == {"predictions"} | ({"logits"} if "Poisson" in name else set())
    assert FIRST_VARIABLE[re.match(r"DNN|Linear|Baseline", name).group(0)] in result["variables"]
    assert serving["method"] == "tensorflow/serving/regress"
    assert {"serving_default", "regression", "predict"} <= set(serving["signatures"])
    assert len(serving["outputs"]["outputs"]) == 2


def test_the_wide_and_deep_model_keeps_tf_1x_variable_names_and_optimizer_slots(one_process):
    # An old model_dir restores only if every name matches: the columns' weights and Ftrl's two slots, the DNN's
    # layers and Adagrad's slot.
    names = set(one_process["DNNLinearCombinedClassifier"]["variables"])
    assert {"linear/linear_model/education/weights", "linear/linear_model/education/weights/Ftrl",
            "linear/linear_model/education/weights/Ftrl_1", "linear/linear_model/bias_weights",
            "linear/linear_model/age_bucketized_X_education/weights",
            "dnn/input_from_feature_columns/input_layer/city_embedding/embedding_weights",
            "dnn/hiddenlayer_0/kernel", "dnn/hiddenlayer_0/kernel/Adagrad", "dnn/logits/bias",
            "global_step"} <= names


@pytest.mark.timeout(300)
def test_parse_specs_pandas_input_add_metrics_and_best_exporter_work_as_in_tf_1x(tmp_path):
    program = (__import__("pathlib").Path(__file__).parent / "programs" / "canned_helpers.py").read_text()
    r = run_tf1(tmp_path, program, "--model_dir", tmp_path / "model", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(re.search(r"^RESULT (.*)$", r.stdout, re.M).group(1))
    assert result["spec"] == result["regression_spec"] == ["c", "x", "y"]     # the columns' features and the label
    assert result["metrics"]["my_auc"] > 0.9 and result["metrics"]["accuracy"] > 0.9     # add_metrics' own metric
    assert 1 <= len(result["best_exports"]) <= 2          # BestExporter: the best ones, exports_to_keep=2


@pytest.mark.timeout(300)
def test_the_estimator_classes_take_each_head_of_tf_estimator_multi_head_included(tmp_path):
    program = (__import__("pathlib").Path(__file__).parent / "programs" / "canned_heads.py").read_text()
    r = run_tf1(tmp_path, program, "--model_dir", tmp_path / "models", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^RESULT (\S+) (.*)$", r.stdout, re.M)}
    assert got["MultiClassHead"]["metrics"]["accuracy"] > 0.9
    assert set(got["MultiClassHead"]["prediction"]) == {"logits", "probabilities", "class_ids", "classes",
                                                        "all_class_ids", "all_classes"}
    assert got["MultiLabelHead"]["metrics"]["auc"] > 0.95
    assert got["MultiLabelHead"]["prediction"] == ["classes", "logits", "probabilities"]
    assert len(got["MultiLabelHead"]["outputs"]["scores"][0]) == 3          # one probability per label
    assert got["LogisticRegressionHead"]["prediction"] == ["logits", "predictions"]
    assert got["LogisticRegressionHead"]["method"] == "tensorflow/serving/regress"
    # A MultiHead names each head's metrics, predictions and signatures; serving_default is its first head's.
    multi = got["MultiHead"]
    assert {"loss/tags", "loss/score", "auc/tags", "average_loss/score", "loss"} <= set(multi["metrics"])
    assert multi["prediction"] == ["score/predictions", "tags/classes", "tags/logits", "tags/probabilities"]
    assert {"tags/classification", "score/regression", "serving_default"} <= set(multi["signatures"])
    assert multi["method"] == "tensorflow/serving/classify"


def trained_on_a_cluster(tmp_path, name, tasks, *more):
    """``name`` trained under ``tfcluster local --tf1`` with an evaluator: the run, its steps per worker."""
    from test_legacy_programs import Ran, assert_clean_exit, checkpoint_value
    # A baseline (one bias) runs 200 steps in about a second: worker:0 once ran them all before worker:1 joined.
    max_steps = "1000" if name.startswith("Baseline") else "200"
    run = Ran(tmp_path, "canned.py", [*tasks, "--evaluator"],
              ["--model_dir", str(tmp_path / "model"), "--estimator", name, "--max_steps", max_steps, *more])
    assert_clean_exit(run)
    steps = {task: int(n.split()[-1]) for task, n in run.printed("STEPS").items()}
    assert set(steps) == {"worker:0", "worker:1"} and min(steps.values()) > 0, steps     # both trained
    # One shared model: every step is the model's, but for the other worker's last one when it lands after the
    # chief's final save (CI saw 199 + 2 steps and a checkpoint at 200, the chief slow to start).
    final = checkpoint_value(tmp_path / "model", "global_step")
    assert sum(steps.values()) - 1 <= final <= sum(steps.values()), (final, steps)
    evaluated = json.loads(run.printed("EVAL")["evaluator:0"])
    # The evaluator ends at the first checkpoint at max_steps or past it: the chief's final save may come one step
    # later, when the other worker's last step lands first (CI-42: evaluated 200, final 201).
    assert int(max_steps) <= evaluated["global_step"] <= final and "loss" in evaluated, (evaluated, final)
    learns = not name.startswith("Baseline")          # a baseline predicts the label mean: nothing to learn beyond
    if learns and ("Classifier" in name or name in ("DNNEstimator", "DNNLinearCombinedEstimator", "wide_deep")):
        # 200 async steps: wide & deep on two ps reached 0.70 to 0.81 in three runs; the majority class is 0.56.
        assert evaluated["accuracy"] > 0.66, evaluated
    # The chief exports the model the cluster trained and serves tf.Example strings from it, as TF 1.x did.
    served = json.loads(run.printed("SERVED")["worker:0"])
    assert served["method"] == ("tensorflow/serving/regress" if regression(name) else "tensorflow/serving/classify")
    assert len(served["outputs"]["outputs" if regression(name) else "scores"]) == 2
    assert "private copy" not in run.out      # evaluating and exporting on a trainer train nothing
    return run


def regression(name):
    return "Regressor" in name or name == "LinearEstimator"      # tests/programs/canned.py's regression heads


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [n for n in CLASSES if n != "DNNLinearCombinedClassifier"])    # wide & deep: below
def test_each_canned_estimator_trains_one_model_shared_by_both_workers_evaluates_and_serves(tmp_path, name):
    # Every class unchanged under tfcluster local --tf1: DNNs on Adagrad and Adam, linear models on Ftrl and
    # their defaults, wide & deep under a tf.contrib.estimator head, baselines; train_and_evaluate with an
    # evaluator task.
    trained_on_a_cluster(tmp_path, name, ["--ps", "1", "--workers", "2"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wide_and_deep_trains_shared_on_two_ps_with_its_input_layer_split_over_both(tmp_path):
    run = trained_on_a_cluster(tmp_path, "wide_deep", ["--ps", "2", "--workers", "2"], "--partitions", "2")
    # Every variable's two parts spread over both ps, by bytes (the placement report: what each ps holds).
    assert re.search(r"^\[worker:0\] tfcluster: info: worker:0 placed \d+ variable\(s\): /job:ps/task:0 [\d.]+ KB, "
                     r"/job:ps/task:1 [\d.]+ KB", run.out, re.M), run.out[-3000:]
    # Each ps saved its own parts, as TF 1.x's Estimator did (its Scaffold's Saver was sharded).
    assert [f.split(".data-")[1] for f in data_files(tmp_path / "model")] == ["00000-of-00002", "00001-of-00002"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_early_stopping_hook_on_the_chief_stops_every_worker_once_the_evaluator_is_good_enough(tmp_path):
    # tf.estimator.experimental.stop_if_higher_hook, TF 1.x's: the chief reads the evaluator's metrics and sets a
    # flag the other workers read, which is on the ps because the hooks begin under the model's device function.
    from test_legacy_programs import Ran, assert_clean_exit, assert_one_global_step_counts_every_step
    run = Ran(tmp_path, "canned.py", ["--ps", "1", "--workers", "2", "--evaluator"],
              ["--model_dir", str(tmp_path / "model"), "--estimator", "DNNClassifier", "--max_steps", "1000000",
               "--stop_above", "0.8"])
    assert_clean_exit(run)
    steps = {task: int(n.split()[-1]) for task, n in run.printed("STEPS").items()}
    # Far before max_steps: worker:1, whose hook only reads the flag, stopped because the chief set it on the ps.
    # (When it stops depends on the evaluator's pace: one run on a loaded machine stopped after 21,223 steps.)
    assert set(steps) == {"worker:0", "worker:1"} and sum(steps.values()) < 100_000, steps
    assert_one_global_step_counts_every_step(tmp_path / "model", steps)
    assert json.loads(run.printed("EVAL")["evaluator:0"])["accuracy"] > 0.8


EARLY_STOPPING = """
import numpy as np
import tensorflow as tf

def model_fn(features, labels, mode):
    loss = tf.reduce_mean(tf.square(tf.layers.dense(features["x"], 1) - labels))
    train = tf.train.GradientDescentOptimizer(0.1).minimize(loss, tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

x = np.random.RandomState(0).rand(200, 1).astype(np.float32)
estimator = tf.estimator.Estimator(model_fn, model_dir="model")
hook = tf.estimator.experimental.stop_if_lower_hook(estimator, "loss", threshold=1e9, run_every_secs=None,
                                                    run_every_steps=5)
train = tf.estimator.inputs.numpy_input_fn({"x": x}, x * 2, num_epochs=None, shuffle=True)
estimator.train(train, steps=10)
# An evaluation whose loss is below the threshold: the hook stops the next training at its first check.
estimator.evaluate(tf.estimator.inputs.numpy_input_fn({"x": x}, x * 2, batch_size=200, shuffle=False))
estimator.train(train, hooks=[hook], steps=500)
print("STOPPED AT", estimator.get_variable_value("global_step"))
"""


@pytest.mark.timeout(120)
def test_early_stopping_hooks_take_an_estimator_of_ones_own_model_fn(tmp_path):
    r = run_tf1(tmp_path, EARLY_STOPPING)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^STOPPED AT (\d+)$", r.stdout, re.M) and int(r.stdout.split()[-1]) < 100, r.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("code, says", [
    ("tf.estimator.DNNClassifier([4], [tf.feature_column.categorical_column_with_hash_bucket('c', 10)])"
     ".train(lambda: ({'c': tf.constant([['a']])}, tf.constant([[1]])), steps=1)",
     r"DNNClassifier: .*wrap a categorical column with an embedding_column or indicator_column\. Given: "
     r"HashedCategoricalColumn\(key='c'"),
    ("tf.estimator.LinearClassifier([tf.feature_column.numeric_column('x')])"
     ".train(lambda: ({'y': tf.constant([[1.]])}, tf.constant([[1]])), steps=1)",
     r"LinearClassifier: .*x"),
    ("tf.estimator.DNNClassifier([4], [tf.feature_column.numeric_column('x')], n_classes=3)"
     ".train(lambda: ({'x': tf.constant([[1.]])}, tf.constant([[5]])), steps=1)",
     r"DNNClassifier: Labels must <= n_classes - 1 .* \(a label is outside n_classes\)"),
    ("tf.estimator.LinearClassifier([tf.feature_column.numeric_column('x')], label_vocabulary=['no', 'yes'])"
     ".train(lambda: ({'x': tf.constant([[1.]])}, tf.constant([['maybe']])), steps=1)",
     r"a training step failed on its input: .*Labels must >= 0.*\(a label is negative, or not in label_vocabulary"),
    ("tf.estimator.LinearRegressor([tf.feature_column.numeric_column('x')], weight_column='w')"
     ".train(lambda: ({'x': tf.constant([[1.]]), 'w': tf.constant([['heavy']])}, tf.constant([[1.]])), steps=1)",
     r"a training step failed on its input: linear/head/weights/Cast: Cast string to float is not supported "
     r"\(weight_column must name a numeric feature\)"),
    ("tf.estimator.DNNClassifier([4], [tf.feature_column.numeric_column('x')], optimizer='Adamm')"
     ".train(lambda: ({'x': tf.constant([[1.]])}, tf.constant([[1]])), steps=1)",
     r"Adamm"),
    ("tf.estimator.BoostedTreesClassifier", r"tf\.estimator\.BoostedTreesClassifier is gone in TF 2\.16"),
    ("tf.estimator.experimental.LinearSDCA", r"tf\.estimator\.experimental\.LinearSDCA is gone in TF 2\.16.*"
                                             r"early-stopping hooks"),
    ("tf.estimator.BaselineEstimator(tf.estimator.RegressionHead())",
     r"BaselineEstimator with a v2 head \(RegressionHead\) is not covered yet"),
    ("import sys\nsys.modules['pandas'] = None     # as if not installed\n"
     "tf.estimator.inputs.pandas_input_fn(None)", r"pandas_input_fn needs pandas: pip install 'tfcluster\[pandas\]'"),
])
def test_bad_canned_input_is_one_line_naming_what_is_wrong(tmp_path, code, says):
    r = run_tf1(tmp_path, f"import tensorflow as tf\n{code}\n", env=base_env())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("tfcluster: error:")]
    assert len(errors) == 1 and re.search(says, errors[0]), r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_canned_estimator_in_sync_ends_at_the_weights_of_one_process_on_the_global_batch(tmp_path):
    # SyncReplicasOptimizer as a LinearRegressor's optimizer: each step averages one gradient from each worker.
    import numpy as np
    from test_legacy_programs import Ran, assert_clean_exit, checkpoint_value
    run = Ran(tmp_path, "canned_sync.py", ["--ps", "1", "--workers", "2"],
              ["--model_dir", str(tmp_path / "model"), "--max_steps", "30"])
    assert_clean_exit(run)
    assert {task: n.split()[-1] for task, n in run.printed("STEPS").items()} == {"worker:0": "30", "worker:1": "30"}
    # One process: gradient descent on the mean squared error of both workers' 16 rows at once, from zeros.
    rng = np.random.RandomState(0)
    a, b = rng.rand(512).astype(np.float32), rng.rand(512).astype(np.float32)
    x, y = np.stack([a, b], 1), 1.0 * a - 2.0 * b + 0.5
    w, bias = np.zeros(2), 0.0
    for step in range(30):
        rows = np.concatenate([np.take(np.arange(k, 512, 2), range(step * 16, (step + 1) * 16), mode="wrap")
                               for k in range(2)])     # each shard repeats
        error = x[rows].dot(w) + bias - y[rows]
        w, bias = w - 0.1 * 2 * x[rows].T.dot(error) / len(rows), bias - 0.1 * 2 * error.mean()
    got = [checkpoint_value(tmp_path / "model", f"linear/linear_model/{c}/weights")[0, 0] for c in "ab"]
    np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(checkpoint_value(tmp_path / "model", "linear/linear_model/bias_weights")[0], bias,
                               rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(200)
def test_the_wide_and_deep_example_trains_on_the_csv_files_it_writes_and_prints_its_auc(tmp_path):
    import subprocess
    from test_tf1_gaps import TF1
    example = __import__("pathlib").Path(__file__).resolve().parent.parent / "examples" / "wide_deep.py"
    r = subprocess.run(TF1 + [str(example), "--model_dir", str(tmp_path / "model"), "--train_steps", "300"],
                       capture_output=True, text=True, env=base_env(), timeout=180, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    found = re.search(r"^wide & deep at step 300: auc ([\d.]+), accuracy ([\d.]+) \(baseline ([\d.]+)\)$", r.stdout, re.M)
    assert found, r.stdout[-2000:]
    auc, accuracy, baseline = map(float, found.groups())
    assert auc > 0.85 and accuracy > baseline
    assert (tmp_path / "model_data" / "train.csv").stat().st_size > 0      # the data it made, beside the model
