"""tf.estimator for TF 1.x programs, in one process: what is covered, and what is refused in one line.

The distributed runs of whole TF 1.x programs (Estimator, model_to_estimator,
the tutorials' Keras program) under ``tfcluster local --tf1`` are in
test_legacy_programs.py; here the API itself: RunConfig's roles from
TF_CONFIG, train / evaluate / predict / export_saved_model, hooks and
listeners, numpy_input_fn, train_and_evaluate without a cluster.
"""

import json
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

from tfcluster import estimator as est  # noqa: E402
from tfcluster.core.errors import ModelFnError, SpecError, TF1RemovedError  # noqa: E402

RNG = np.random.RandomState(0)
X = RNG.rand(256, 4).astype(np.float32)
Y = np.digitize(X.dot([1.0, -2.0, 0.5, 3.0]), [0.6, 1.8]).astype(np.int64)


def dense(x, units, name):
    with tf1.variable_scope(name):
        w = tf1.get_variable("kernel", [x.shape[-1], units], initializer=tf1.glorot_uniform_initializer(seed=1))
        return tf.matmul(x, w) + tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())


def model_fn(features, labels, mode, params):
    hidden = tf.nn.relu(dense(features["x"], 16, "hidden")) if params.get("hidden") else features["x"]
    logits = dense(hidden, 3, "logits")
    classes = tf.argmax(logits, 1)
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"class": classes, "logits": logits})
    loss = tf1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    if mode == est.ModeKeys.EVAL:
        return est.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": tf1.metrics.accuracy(labels, classes)})
    train_op = tf1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=tf1.train.get_global_step())
    return est.EstimatorSpec(mode, loss=loss, train_op=train_op)


def placeholder():
    """A feature placeholder, as a TF 1.x program makes one (in a graph)."""
    with tf1.Graph().as_default():
        return tf1.placeholder(tf.float32, [None, 4])


def train_input(epochs=None):
    return est.inputs.numpy_input_fn({"x": X}, Y, batch_size=32, num_epochs=epochs, shuffle=True)


def eval_input():
    return est.inputs.numpy_input_fn({"x": X}, Y, batch_size=64, shuffle=False)


@pytest.fixture
def estimator(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    return est.Estimator(model_fn, model_dir=str(tmp_path / "model"), params={"hidden": False},
                         config=est.RunConfig(save_checkpoints_steps=20, log_step_count_steps=0))


# ------------------------------------------------------------------ RunConfig
def tf_config(monkeypatch, cluster, task_type, index=0):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}}))
    return est.RunConfig()


CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"], "ps": ["localhost:4"]}


def test_run_config_takes_this_tasks_role_from_tf_config(monkeypatch):
    chief = tf_config(monkeypatch, CLUSTER, "chief")
    assert (chief.task_type, chief.task_id, chief.is_chief, chief.master) == ("chief", 0, True, "grpc://localhost:1")
    assert (chief.num_ps_replicas, chief.num_worker_replicas, chief.global_id_in_cluster) == (1, 3, 0)
    worker = tf_config(monkeypatch, CLUSTER, "worker", 1)
    assert (worker.is_chief, worker.global_id_in_cluster, worker.master) == (False, 2, "grpc://localhost:3")
    ps = tf_config(monkeypatch, CLUSTER, "ps")
    assert (ps.is_chief, ps.global_id_in_cluster) == (False, 3)
    evaluator = tf_config(monkeypatch, CLUSTER, "evaluator")
    assert (evaluator.is_chief, evaluator.master, evaluator.task_type) == (False, "", "evaluator")
    master = tf_config(monkeypatch, {"master": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}, "master")
    assert master.is_chief and master.num_worker_replicas == 2
    monkeypatch.delenv("TF_CONFIG")
    alone = est.RunConfig()
    assert (alone.task_type, alone.is_chief, alone.master, alone.num_worker_replicas) == ("worker", True, "", 1)


def test_run_config_saves_every_600s_by_default_and_refuses_both_periods_or_a_strategy_not_of_tf1_mode():
    c = est.RunConfig()
    assert (c.save_checkpoints_secs, c.save_checkpoints_steps, c.keep_checkpoint_max) == (600, None, 5)
    assert est.RunConfig(save_checkpoints_steps=10).save_checkpoints_secs is None
    assert est.RunConfig().replace(save_checkpoints_steps=7).save_checkpoints_secs is None
    with pytest.raises(SpecError, match="not both"):
        est.RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=10)
    with pytest.raises(SpecError, match=r"RunConfig\(train_distribute=\.\.\.\) takes a tf\.contrib\.distribute "
                                        r"strategy under TF1 mode \(docs/tf1\.md\), not object"):
        est.RunConfig(train_distribute=object())
    with pytest.raises(SpecError, match=r"RunConfig\(eval_distribute=\.\.\.\) takes"):
        est.RunConfig(eval_distribute=object())


# ---------------------------------------------------- train / evaluate / predict
def test_train_evaluate_and_predict_run_a_custom_model_fn_in_one_process(estimator):
    estimator.train(train_input(), max_steps=60)
    assert estimator.get_variable_value("global_step") == 60
    estimator.train(train_input(), max_steps=60)             # already there: nothing to do
    assert estimator.get_variable_value("global_step") == 60
    estimator.train(train_input(), steps=10)                 # steps count from where it stands
    assert estimator.get_variable_value("global_step") == 70
    metrics = estimator.evaluate(eval_input())
    assert metrics["global_step"] == 70 and metrics["accuracy"] > 0.6 and set(metrics) == {
        "accuracy", "loss", "global_step"}
    predictions = list(estimator.predict(est.inputs.numpy_input_fn({"x": X[:5]}, shuffle=False)))
    assert len(predictions) == 5 and set(predictions[0]) == {"class", "logits"}
    assert os.path.isdir(estimator.eval_dir())


def test_a_finite_input_ends_training_when_it_runs_out(estimator):
    estimator.train(train_input(epochs=1))                    # 256 examples, 32 a batch
    assert estimator.get_variable_value("global_step") == 8


def test_an_exported_saved_model_serves_in_tf2_and_predicts_what_the_estimator_predicts(estimator, tmp_path):
    estimator.train(train_input(), max_steps=40)
    receiver = est.export.build_raw_serving_input_receiver_fn({"x": placeholder()})
    path = estimator.export_saved_model(str(tmp_path / "export"), receiver)
    served = tf.saved_model.load(path.decode()).signatures["serving_default"](x=tf.constant(X[:8]))
    expected = list(estimator.predict(est.inputs.numpy_input_fn({"x": X[:8]}, shuffle=False)))
    np.testing.assert_allclose(served["logits"].numpy(), np.stack([p["logits"] for p in expected]), rtol=1e-6)
    assert served["class"].numpy().tolist() == [int(p["class"]) for p in expected]


def test_exporting_a_checkpoint_the_chief_rotated_away_is_the_evaluators_skip_not_a_crash(estimator, tmp_path):
    # The evaluator exports after it evaluated; a chief that saves often may have deleted that checkpoint by then.
    from tfcluster.runtime.checkpoints import CheckpointUnreadable
    estimator.train(train_input(), max_steps=10)
    latest = estimator.latest_checkpoint()
    for part in tmp_path.glob("model/" + os.path.basename(latest) + ".*"):
        part.unlink()
    receiver = est.export.build_raw_serving_input_receiver_fn({"x": placeholder()})
    with pytest.raises(CheckpointUnreadable, match="vanished"):
        estimator.export_saved_model(str(tmp_path / "export"), receiver, checkpoint_path=latest)


def test_hooks_run_around_the_steps_and_stop_training_and_listeners_hear_each_save(estimator):
    class Count(tf1.train.SessionRunHook):
        steps = 0

        def after_run(self, run_context, run_values):
            Count.steps += 1

    class Listener(tf1.train.CheckpointSaverListener):
        saved = []

        def after_save(self, session, global_step_value):
            Listener.saved.append(global_step_value)
    estimator.train(train_input(), hooks=[Count(), tf1.train.StopAtStepHook(num_steps=25)], max_steps=1000,
                    saving_listeners=[Listener()])
    assert Count.steps == 25 and estimator.get_variable_value("global_step") == 25
    assert Listener.saved == [20, 25]


def test_a_model_fn_s_own_checkpoint_saver_hook_saves_instead_of_the_estimator_s_as_in_tf_1x(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    model_dir = str(tmp_path / "model")

    class Listener(tf1.train.CheckpointSaverListener):
        saved = []

        def after_save(self, session, global_step_value):
            Listener.saved.append(global_step_value)

    def saving_model_fn(features, labels, mode, params):
        spec = model_fn(features, labels, mode, params)
        if mode != est.ModeKeys.TRAIN:
            return spec
        return spec._replace(training_chief_hooks=[tf1.train.CheckpointSaverHook(model_dir, save_steps=15)])

    estimator = est.Estimator(saving_model_fn, model_dir=model_dir, params={},
                              config=est.RunConfig(save_checkpoints_steps=20, log_step_count_steps=0))
    estimator.train(train_input(), max_steps=45, saving_listeners=[Listener()])
    steps = sorted(int(f.split("-")[1].split(".")[0]) for f in os.listdir(model_dir) if f.endswith(".index"))
    # The program's period, not RunConfig's 20 (and TF's hook saves the step it starts at, as in TF 1.x).
    assert steps == [0, 15, 30, 45]
    assert Listener.saved == [0, 15, 30, 45]        # the listeners hear the program's hook, as in TF 1.x


def test_train_and_evaluate_without_a_cluster_evaluates_and_exports_at_the_end(estimator, tmp_path):
    receiver = est.export.build_raw_serving_input_receiver_fn({"x": placeholder()})
    result, exports = est.train_and_evaluate(
        estimator, est.TrainSpec(train_input(), max_steps=30),
        est.EvalSpec(eval_input(), steps=None, exporters=[est.FinalExporter("final", receiver)], throttle_secs=0))
    assert result["global_step"] == 30 and len(exports) == 1 and os.path.isdir(exports[0])


# ------------------------------------------------------------------- refusals
def test_a_train_op_that_never_moves_the_global_step_is_stopped_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)

    def forgetful(features, labels, mode):
        loss = tf.reduce_mean(dense(features["x"], 1, "d")[:, 0] - tf.cast(labels, tf.float32))
        return est.EstimatorSpec(mode, loss=loss, train_op=tf1.train.GradientDescentOptimizer(0.1).minimize(loss))
    with pytest.raises(ModelFnError, match="does not increase the global step"):
        est.Estimator(forgetful, model_dir=str(tmp_path)).train(train_input(), max_steps=100)


@pytest.mark.parametrize("what, build, message", [
    ("boosted trees", lambda: est.BoostedTreesClassifier, "tf.estimator.BoostedTreesClassifier is gone in TF 2.16; "
     "use a DNN or linear canned estimator"),
    ("numpy input without shuffle", lambda: est.inputs.numpy_input_fn({"x": X}, Y), "shuffle must be True or False"),
    ("a spec without a train_op", lambda: est.EstimatorSpec(est.ModeKeys.TRAIN, loss=tf.constant(1.0)),
     "TRAIN mode needs loss and train_op"),
    ("a model_fn with an unknown argument", lambda: est.Estimator(lambda features, labels, mode, hparams: None),
     "model_fn takes hparams"),
    ("params the model_fn cannot take", lambda: est.Estimator(lambda features, labels: None, params={"a": 1}),
     "takes no 'params'"),
])
def test_what_is_not_covered_or_wrong_stops_in_one_line_naming_what_to_do(what, build, message):
    with pytest.raises((TF1RemovedError, SpecError, ModelFnError)) as info:
        with tf1.Graph().as_default():
            build()
    assert message in str(info.value) and "\n" not in str(info.value), what
