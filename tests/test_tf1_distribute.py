"""TF1 mode's ``tf.contrib.distribute``: the TF 1.11 tutorial's strategy programs run unchanged, or say in one
line what is not covered yet.

Covered: every strategy under ``compile(distribute=...)``, ``strategy.scope()``, ``RunConfig(train_distribute=...)``
and ``model_to_estimator``: towers in one process and ``CollectiveAllReduceStrategy`` across TF_CONFIG's workers,
each equal to one process on the global batch; ``ParameterServerStrategy`` on a TF_CONFIG with ps tasks, shared.
Refused in one line: several replicas on a cluster under Keras's compile or (on ps tasks) model_to_estimator,
ps tasks beside Keras's all-reduce, a remote cluster, the strategies' members beyond the basics.
"""

import json
import pathlib
import re

import numpy as np
import pytest

from conftest import base_env
from test_tf1_gaps import run_tf1

HERE = pathlib.Path(__file__).resolve().parent
#: One-process reference runs by name: the cases of a parametrized test compare with the same run, made once.
_REFERENCES = {}


def reference(name, run):
    """``run()``'s result, computed once for this module under ``name``."""
    if name not in _REFERENCES:
        _REFERENCES[name] = run()
    return _REFERENCES[name]

# The tutorial's Keras program (TF 1.11), with a seed so that two runs start from the same weights.
# DISTRIBUTE is replaced by the compile argument under test.
KERAS = r'''
import json
import sys
import tensorflow as tf

tf.set_random_seed(1)
inputs = tf.keras.layers.Input(shape=(1,))
predictions = tf.keras.layers.Dense(1)(inputs)
model = tf.keras.models.Model(inputs=inputs, outputs=predictions)

features = tf.data.Dataset.from_tensors([1.]).repeat(10000).batch(10)
labels = tf.data.Dataset.from_tensors([1.]).repeat(10000).batch(10)
train_dataset = tf.data.Dataset.zip((features, labels))

model.compile(loss='mean_squared_error', optimizer=tf.train.GradientDescentOptimizer(learning_rate=0.2)DISTRIBUTE)
model.fit(train_dataset, epochs=5, steps_per_epoch=10)
loss = model.evaluate(train_dataset, steps=1)
predicted = model.predict(tf.data.Dataset.from_tensors([[1.]]), steps=1)
print("RESULT " + json.dumps({"weights": [w.tolist() for w in model.get_weights()], "loss": float(loss),
                              "predicted": predicted.tolist()}))
'''


def keras_run(tmp_path, distribute, env=None):
    r = run_tf1(tmp_path, KERAS.replace("DISTRIBUTE", distribute), env=env)
    found = re.search(r"^RESULT (.*)$", r.stdout, re.M)
    return r, (json.loads(found.group(1)) if found else None)


@pytest.mark.timeout(150)
def test_the_tutorials_keras_program_with_mirrored_strategy_trains_as_one_process_does(tmp_path):
    r, mirrored = keras_run(tmp_path, ", distribute=tf.contrib.distribute.MirroredStrategy()")
    assert r.returncode == 0, r.stderr[-3000:]
    # No GPU and none asked for: TF 1.x's MirroredStrategy used the CPU alone, and says so in one line.
    notes = [line for line in r.stderr.splitlines() if "compile(distribute=...)" in line]
    assert notes == ["tfcluster: info: compile(distribute=...): MirroredStrategy: 1 replica(s) per worker on "
                     "/cpu:0 (no GPU, none asked for), the update of one process"]
    r, plain = keras_run(tmp_path, "")
    assert r.returncode == 0, r.stderr[-3000:]
    for a, b in zip(mirrored["weights"], plain["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert mirrored["loss"] == pytest.approx(plain["loss"]) and mirrored["loss"] < 1e-3   # it learned y = 1
    np.testing.assert_allclose(mirrored["predicted"], plain["predicted"], rtol=1e-6)


# The tutorial's Keras shape on data that makes every example count: two inputs' worth of random features,
# a hidden layer, a tf.train optimizer, a dataset of batches of 10; DISTRIBUTE as above.
KERAS_RANDOM = r'''
import json
import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.randn(200, 3).astype(np.float32)
y = (x @ np.array([[1.], [-2.], [0.5]], np.float32)).astype(np.float32)
inputs = tf.keras.layers.Input(shape=(3,))
hidden = tf.keras.layers.Dense(8, activation="tanh", kernel_initializer=tf.keras.initializers.glorot_uniform(1))(inputs)
predictions = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.glorot_uniform(2))(hidden)
model = tf.keras.models.Model(inputs=inputs, outputs=predictions)
model.compile(loss="mean_squared_error", optimizer=tf.train.MomentumOptimizer(0.05, 0.9), metrics=["mae"]DISTRIBUTE)
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(10), epochs=2, steps_per_epoch=10, verbose=0)
loss = [float(v) for v in model.evaluate(x, y, batch_size=50, verbose=0)]
graph = tf.get_default_graph()
print("RESULT " + json.dumps({"weights": [w.tolist() for w in model.get_weights()], "loss": loss,
                              "updates": int(tf.keras.backend.get_value(model.optimizer.iterations)),
                              "devices": sorted({op.device for op in graph.get_operations()
                                                 if op.name.startswith("tower_") and op.type != "ReadVariableOp"}),
                              "predicted": model.predict(x[:7]).tolist()}))
'''


def keras_random_alone(tmp_path) -> dict:
    r = run_tf1(tmp_path, KERAS_RANDOM.replace("DISTRIBUTE", ""))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(re.search(r"^RESULT (.*)$", r.stdout, re.M).group(1))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["MirroredStrategy(num_gpus=2)", "MirroredStrategy(['/cpu:0', '/cpu:1'])"])
def test_several_replicas_in_one_process_train_keras_as_one_process_on_the_global_batch(tmp_path, strategy):
    r = run_tf1(tmp_path, KERAS_RANDOM.replace("DISTRIBUTE", f", distribute=tf.contrib.distribute.{strategy}"))
    assert r.returncode == 0, r.stderr[-3000:]
    towers = json.loads(re.search(r"^RESULT (.*)$", r.stdout, re.M).group(1))
    assert "model runs on 2 tower(s) on /device:CPU:0, /device:CPU:1 (virtual CPU devices): each batch split over " \
           "them, one update per step" in r.stderr, r.stderr[-2000:]
    # Each tower computes on its own device (its reads of the weights are colocated with them).
    assert towers["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    alone = reference("keras alone", lambda: keras_random_alone(tmp_path))
    assert towers["updates"] == alone["updates"] == 20          # one update per step, from both towers
    for a, b in zip(towers["weights"], alone["weights"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(towers["loss"], alone["loss"], rtol=1e-5)      # evaluate: [loss, mae]
    np.testing.assert_allclose(towers["predicted"], alone["predicted"], rtol=1e-5, atol=1e-6)   # 7 rows: 4 + 3


@pytest.mark.timeout(120)
def test_several_replicas_of_a_model_without_an_input_shape_are_refused_in_one_line(tmp_path):
    program = KERAS.replace("inputs = tf.keras.layers.Input(shape=(1,))\npredictions = tf.keras.layers.Dense(1)(inputs)"
                            "\nmodel = tf.keras.models.Model(inputs=inputs, outputs=predictions)",
                            "model = tf.keras.Sequential([tf.keras.layers.Dense(1)])")
    assert "Sequential" in program
    two = ", distribute=tf.contrib.distribute.MirroredStrategy(num_gpus=2)"
    r = run_tf1(tmp_path, program.replace("DISTRIBUTE", two))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("tfcluster: error:")]
    assert errors == ["tfcluster: error: compile(distribute=...) with several replicas splits the model's inputs, "
                      "which a model without an input shape does not have yet; give its first layer an input_shape"]


# The tutorial's Estimator form: the same model, model_to_estimator, a RunConfig naming the strategy.
ESTIMATOR = r'''
import json
import sys
import tensorflow as tf

inputs = tf.keras.layers.Input(shape=(1,))
predictions = tf.keras.layers.Dense(1)(inputs)
model = tf.keras.models.Model(inputs=inputs, outputs=predictions)
model.compile(loss='mean_squared_error', optimizer=tf.train.GradientDescentOptimizer(learning_rate=0.2))

config = tf.estimator.RunConfig(CONFIG)
keras_estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config, model_dir=sys.argv[1])

def input_fn():
    features = tf.data.Dataset.from_tensors([[1.]]).repeat(10000).batch(10)
    labels = tf.data.Dataset.from_tensors([[1.]]).repeat(10000).batch(10)
    return tf.data.Dataset.zip(({model.input_names[0]: features}, labels))

keras_estimator.train(input_fn=input_fn, steps=10)
result = keras_estimator.evaluate(input_fn=input_fn, steps=1)
print("RESULT " + json.dumps({k: float(v) for k, v in result.items()}))
'''


@pytest.mark.timeout(150)
@pytest.mark.parametrize("config", [
    "train_distribute=tf.contrib.distribute.MirroredStrategy()",
    "experimental_distribute=tf.contrib.distribute.DistributeConfig("
    "train_distribute=tf.contrib.distribute.OneDeviceStrategy('/cpu:0'), "
    "eval_distribute=tf.contrib.distribute.MirroredStrategy(num_gpus_per_worker=2))",
])
def test_the_tutorials_estimator_form_trains_and_evaluates_with_its_strategy(tmp_path, config):
    r = run_tf1(tmp_path, ESTIMATOR.replace("CONFIG", config), tmp_path / "model")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(re.search(r"^RESULT (.*)$", r.stdout, re.M).group(1))
    assert result["global_step"] == 10 and result["loss"] < 0.05
    assert re.search(r"^tfcluster: info: RunConfig\(\S+=\.\.\.\)\)?: \w+Strategy: 1 replica\(s\) per worker on "
                     r"/cpu:0", r.stderr, re.M), r.stderr[-2000:]


# A TF 1.x Estimator program with a model_fn of its own (tf.layers, a mean loss, optimizer.minimize with
# UPDATE_OPS): BATCH examples per input_fn batch, the strategy named in the RunConfig by STRATEGY.
CUSTOM = r"""
import json
import sys
import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.randn(400, 3).astype(np.float32)
y = (x @ np.array([[1.], [-2.], [0.5]], np.float32) + 0.3).astype(np.float32)

def input_fn():
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

def model_fn(features, labels, mode):
    hidden = tf.layers.dense(features, 8, activation=tf.nn.tanh, name="hidden",
                             kernel_initializer=tf.constant_initializer(0.1))
    out = tf.layers.dense(hidden, 1, name="out", kernel_initializer=tf.constant_initializer(0.2))
    loss = tf.losses.mean_squared_error(labels, out)
    with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS)):
        train_op = tf.train.MomentumOptimizer(0.05, 0.9).minimize(loss, tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

config = tf.estimator.RunConfig(train_distribute=STRATEGY, save_checkpoints_steps=1000)
estimator = tf.estimator.Estimator(model_fn, model_dir=sys.argv[1], config=config)
estimator.train(input_fn, steps=20)
print("RESULT " + json.dumps({name: estimator.get_variable_value(name).tolist()
                              for name in ("hidden/kernel", "out/kernel", "out/bias", "global_step")}))
"""


def custom_run(tmp_path, strategy, batch):
    text = CUSTOM.replace("STRATEGY", strategy).replace("BATCH", str(batch))
    r = run_tf1(tmp_path, text, tmp_path / f"model-{batch}")
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(re.search(r"^RESULT (.*)$", r.stdout, re.M).group(1))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("strategy", ["tf.contrib.distribute.MirroredStrategy(num_gpus=2)",
                                      "tf.contrib.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])"])
def test_a_model_fn_on_two_replicas_trains_as_one_process_on_the_global_batch(tmp_path, strategy):
    # TF 1.x's Estimator rule: input_fn's batch is a replica's, so two replicas of 10 make a global batch of 20.
    r, replicas = custom_run(tmp_path, strategy, 10)
    assert re.search(r"^tfcluster: info: RunConfig\(train_distribute=\.\.\.\): MirroredStrategy: 2 replica\(s\) per "
                     r"worker on .*, one update per step from all of them$", r.stderr, re.M), r.stderr[-2000:]
    assert "model_fn runs on 2 tower(s) on /device:CPU:0, /device:CPU:1 (virtual CPU devices)" in r.stderr
    one = reference("model_fn alone", lambda: custom_run(tmp_path, "None", 20)[1])
    assert replicas["global_step"] == one["global_step"] == 20        # one update per step, from both replicas
    for name in ("hidden/kernel", "out/kernel", "out/bias"):
        np.testing.assert_allclose(replicas[name], one[name], rtol=2e-5, atol=1e-6)
    assert replicas["out/bias"] != pytest.approx(0.0)       # it trained


# model_to_estimator of a two-layer model compiled with a tf.train optimizer; input_fn's batch is BATCH (a replica's).
KERAS_ESTIMATOR = r"""
import json
import sys
import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = rng.randn(400, 3).astype(np.float32)
y = (x @ np.array([[1.], [-2.], [0.5]], np.float32) + 0.3).astype(np.float32)
inputs = tf.keras.layers.Input(shape=(3,), name="x")
hidden = tf.keras.layers.Dense(8, activation="tanh", name="hidden",
                               kernel_initializer=tf.keras.initializers.glorot_uniform(seed=1))(inputs)
out = tf.keras.layers.Dense(1, name="out", kernel_initializer=tf.keras.initializers.glorot_uniform(seed=2))(hidden)
model = tf.keras.Model(inputs, out)
model.compile(loss="mse", optimizer=tf.train.MomentumOptimizer(0.05, 0.9))

def input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(BATCH)

config = tf.estimator.RunConfig(train_distribute=STRATEGY, save_checkpoints_steps=1000)
estimator = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=sys.argv[1], config=config)
estimator.train(input_fn, steps=20)
print("RESULT " + json.dumps({name: estimator.get_variable_value(name).tolist()
                              for name in ("hidden/kernel", "out/kernel", "out/bias", "global_step")}))
"""


@pytest.mark.timeout(150)
def test_model_to_estimator_on_two_replicas_trains_as_one_process_on_the_global_batch(tmp_path):
    # The tutorial's Estimator form on a machine with two GPUs (two virtual CPU devices here): a tf-keras model
    # makes new variables on each call, so it runs once, as towers over both replicas' batches.
    def run(strategy, batch):
        text = KERAS_ESTIMATOR.replace("STRATEGY", strategy).replace("BATCH", str(batch))
        r = run_tf1(tmp_path, text, tmp_path / f"model-{batch}")
        assert r.returncode == 0, r.stderr[-3000:]
        return r, json.loads(re.search(r"^RESULT (.*)$", r.stdout, re.M).group(1))

    r, replicas = run("tf.contrib.distribute.MirroredStrategy(num_gpus=2)", 10)
    assert "model_fn runs on 2 tower(s) on /device:CPU:0, /device:CPU:1 (virtual CPU devices)" in r.stderr, \
        r.stderr[-2000:]
    _, one = run("None", 20)
    assert replicas["global_step"] == one["global_step"] == 20        # one update per step, from both replicas
    for name in ("hidden/kernel", "out/kernel", "out/bias"):
        np.testing.assert_allclose(replicas[name], one[name], rtol=2e-5, atol=1e-6)
    assert replicas["out/bias"] != pytest.approx(0.0)       # it trained


@pytest.mark.timeout(120)
@pytest.mark.parametrize("config, tf_config, says", [
    ("experimental_distribute=tf.contrib.distribute.DistributeConfig("
     "train_distribute=tf.contrib.distribute.ParameterServerStrategy(num_gpus_per_worker=2))",
     {"worker": ["localhost:1"], "ps": ["localhost:2"]},
     r"model_to_estimator with ParameterServerStrategy: 2 replica\(s\) per worker on 2 virtual CPU devices on a "
     r"cluster is not covered yet"),
    ("train_distribute=tf.contrib.distribute.MirroredStrategy()", {"worker": ["localhost:1"], "ps": ["localhost:2"]},
     r"with MirroredStrategy trains in one process, but TF_CONFIG has a cluster"),
    ("train_distribute=tf.contrib.distribute.ParameterServerStrategy()", {"worker": ["localhost:1", "localhost:2"]},
     r"with ParameterServerStrategy needs ps tasks, and TF_CONFIG's cluster has none"),
    ("experimental_distribute=tf.contrib.distribute.DistributeConfig(remote_cluster={'worker': ['h:1']})", None,
     r"DistributeConfig\(remote_cluster=\.\.\.\) .* is not covered"),
    ("train_distribute=tf.contrib.distribute.MirroredStrategy().extended", None,
     r"tf\.contrib\.distribute\.MirroredStrategy\.extended is gone in TF 2\.x"),
])
def test_what_is_not_covered_yet_is_refused_in_one_line(tmp_path, config, tf_config, says):
    env = base_env(TF_CONFIG=json.dumps({"cluster": tf_config, "task": {"type": "worker", "index": 0}})) \
        if tf_config else None
    r = run_tf1(tmp_path, ESTIMATOR.replace("CONFIG", config), tmp_path / "model", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("tfcluster: error:")]
    assert len(errors) == 1 and re.search(says, errors[0]), r.stderr[-2000:]


def test_strategies_count_their_replicas_as_tf_1x_did():
    # No TensorFlow needed: GPUs are counted as the launcher counts them (CUDA_VISIBLE_DEVICES, nvidia-smi).
    from tfcluster.tf1 import distribute
    assert distribute.MirroredStrategy(num_gpus=3).num_replicas_in_sync == 3
    assert distribute.MirroredStrategy(num_gpus_per_worker=2).replicas_per_worker == 2
    assert distribute.MirroredStrategy(["/gpu:0", "/gpu:1"]).num_replicas_in_sync == 2
    assert distribute.OneDeviceStrategy("/cpu:0").num_replicas_in_sync == 1
    assert distribute.ParameterServerStrategy().num_replicas_in_sync == 1
    assert distribute.MirroredStrategy(num_gpus=2, cross_device_ops=distribute.AllReduceCrossDeviceOps(
        "hierarchical_copy")).cross_device_ops.args == ("hierarchical_copy",)
    config = distribute.DistributeConfig(train_distribute=distribute.ParameterServerStrategy())
    assert config.eval_distribute is None and config.remote_cluster is None


def test_all_reduce_leaves_an_estimators_ps_tasks_idle_but_refuses_them_under_keras():
    # An Estimator's ps task has a role (serve_as_ps, exit when the workers are done); Keras's has none here.
    from tfcluster.core.errors import SpecError
    from tfcluster.tf1 import distribute
    from tfcluster.topology.cluster import Cluster
    cluster = Cluster.from_tf_config({"TF_CONFIG": json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]},
        "task": {"type": "worker", "index": 0}})})
    strategy = distribute.CollectiveAllReduceStrategy(num_gpus_per_worker=2)
    strategy.check(cluster, "RunConfig(train_distribute=...)", replicas_ok=True)
    with pytest.raises(SpecError, match=r"compile\(distribute=\.\.\.\) with CollectiveAllReduceStrategy uses no ps "
                                        r"tasks, and TF_CONFIG's cluster has some"):
        distribute.CollectiveAllReduceStrategy().check(cluster, "compile(distribute=...)")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_parameter_server_strategy_in_the_run_config_trains_shared_on_the_ps_with_an_evaluator(tmp_path):
    from test_legacy_programs import Ran, assert_clean_exit, assert_one_global_step_counts_every_step
    run = Ran(tmp_path, "keras_to_estimator.py", ["--ps", "1", "--workers", "2", "--evaluator"],
              ["--model_dir", str(tmp_path / "model"), "--max_steps", "300", "--parameter_server_strategy"])
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] tfcluster: info: RunConfig\(train_distribute=\.\.\.\): ParameterServerStrategy"
                         r": 1 replica\(s\) per worker on /cpu:0; variables on the ps tasks", run.out, re.M), \
            run.out[-3000:]
    steps = {task: int(n.split()[-1]) for task, n in run.printed("STEPS").items()}
    assert set(steps) == {"worker:0", "worker:1"} and min(steps.values()) > 0     # both trained
    assert_one_global_step_counts_every_step(tmp_path / "model", steps)          # one shared model
    assert json.loads(run.printed("EVAL")["evaluator:0"])["acc"] > 0.8


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ps, gpus, where", [("0", [], "1 replica\\(s\\) per worker on /cpu:0"),
                                             ("1", ["--gpus", "2"], "2 replica\\(s\\) per worker on 2 virtual CPU")],
                         ids=["one-replica-no-ps", "the-issues-program"])
def test_model_to_estimator_with_collective_all_reduce_trains_a_copy_on_each_worker_with_an_evaluator(
        tmp_path, ps, gpus, where):
    # The public program: model_to_estimator of a model compiled with a tf-keras optimizer (Adam),
    # RunConfig(experimental_distribute=DistributeConfig(CollectiveAllReduceStrategy(num_gpus_per_worker=2),
    # MirroredStrategy(num_gpus_per_worker=2))), train_and_evaluate, under --ps 1 --workers 2 --evaluator: the
    # ps holds nothing and exits at the end, as TF 1.x's coordinator ran it (without ever exiting). Also one
    # replica per worker, no ps.
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "keras_to_estimator.py", ["--ps", ps, "--workers", "2", "--evaluator"],
              ["--model_dir", str(tmp_path / "model"), "--max_steps", "200", "--collective"] + gpus)
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] tfcluster: info: RunConfig\(experimental_distribute=.*CollectiveAllReduce"
                         rf"Strategy: {where}.*; each of the 2 workers holds a copy", run.out, re.M), run.out[-3000:]
        assert re.search(rf"^\[{worker}\] .*{worker}: all 2 workers hold identical variables", run.out, re.M)
    if gpus:
        assert re.search(r"^\[worker:0\] .*the 1 ps task\(s\) hold nothing and exit when the workers are done",
                         run.out, re.M)
        assert re.search(r"^\[worker:1\] tfcluster: info: model_fn runs on 2 tower\(s\)", run.out, re.M)
    # Every step of each worker is one update from both: 200 steps each make global step 200.
    assert {task: n.split()[-1] for task, n in run.printed("STEPS").items()} == {"worker:0": "200", "worker:1": "200"}
    result = json.loads(run.printed("EVAL")["evaluator:0"])
    assert result["global_step"] == 200 and result["acc"] > 0.8, result


def test_mirrored_strategy_takes_every_gpu_listed_and_the_cpu_without_one(monkeypatch):
    from tfcluster.tf1 import distribute
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")          # a fake device list: no GPU here
    assert distribute.MirroredStrategy().num_replicas_in_sync == 2
    assert distribute.MirroredStrategy().describe() == "MirroredStrategy: 2 replica(s) per worker on 2 GPU(s)"
    assert distribute.ParameterServerStrategy().describe().endswith("1 replica(s) per worker on /cpu:0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert distribute.MirroredStrategy().describe() == ("MirroredStrategy: 1 replica(s) per worker on /cpu:0 "
                                                        "(no GPU, none asked for)")
    assert distribute.MirroredStrategy(num_gpus=2).describe().endswith("on 2 virtual CPU devices")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_collective_all_reduce_across_two_workers_trains_as_one_process_on_the_global_batch(tmp_path):
    # A public TF 1.x program's shape: RunConfig(experimental_distribute=DistributeConfig(train_distribute=
    # CollectiveAllReduceStrategy(), eval_distribute=MirroredStrategy())), input_fn(mode, input_context) reading
    # its worker's shard, train_and_evaluate; on a cluster of two workers and an evaluator, no ps.
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "estimator_allreduce.py", ["--ps", "0", "--workers", "2", "--evaluator"],
              ["--model_dir", str(tmp_path / "model"), "--batch", "10"])
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] tfcluster: info: RunConfig\(experimental_distribute=.*CollectiveAllReduce"
                         r"Strategy: 1 replica\(s\) per worker on /cpu:0; each of the 2 workers holds a copy",
                         run.out, re.M), run.out[-3000:]
        # The replicas stayed in step: the copies' checksums agree at the end.
        assert re.search(rf"^\[{worker}\] .*{worker}: all 2 workers hold identical variables", run.out, re.M)
    assert json.loads(run.printed("EVAL")["evaluator:0"])["global_step"] == 20
    cluster = json.loads(run.printed("WEIGHTS")["worker:0"])
    one = run_tf1(tmp_path, (HERE / "programs" / "estimator_allreduce.py").read_text(), "--model_dir",
                  tmp_path / "one", "--batch", "20", "--strategy", "none")
    assert one.returncode == 0, one.stderr[-3000:]
    alone = json.loads(re.search(r"^WEIGHTS (.*)$", one.stdout, re.M).group(1))
    assert cluster["global_step"] == alone["global_step"] == 20          # one update per step from both workers
    for name in ("hidden/kernel", "out/kernel", "out/bias"):
        np.testing.assert_allclose(cluster[name], alone[name], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_collective_all_reduce_with_two_replicas_per_worker_trains_as_one_process_on_the_global_batch(tmp_path):
    # TF 1.x's multi-GPU all-reduce setup, CollectiveAllReduceStrategy(num_gpus_per_worker=2): each worker's two
    # replicas (virtual CPU devices here) read a batch of 10 each, their summed gradients all-reduced over both
    # workers: one update on a global batch of 40.
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "estimator_allreduce.py", ["--ps", "0", "--workers", "2", "--evaluator"],
              ["--model_dir", str(tmp_path / "model"), "--batch", "10", "--towers", "2"])
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] tfcluster: info: model_fn runs on 2 tower\(s\) on /device:CPU:0, "
                         r"/device:CPU:1 \(virtual CPU devices\)", run.out, re.M), run.out[-3000:]
        assert re.search(rf"^\[{worker}\] .*{worker}: all 2 workers hold identical variables", run.out, re.M)
    assert json.loads(run.printed("EVAL")["evaluator:0"])["global_step"] == 20
    cluster = json.loads(run.printed("WEIGHTS")["worker:0"])
    one = run_tf1(tmp_path, (HERE / "programs" / "estimator_allreduce.py").read_text(), "--model_dir",
                  tmp_path / "one", "--batch", "40", "--strategy", "none")
    assert one.returncode == 0, one.stderr[-3000:]
    alone = json.loads(re.search(r"^WEIGHTS (.*)$", one.stdout, re.M).group(1))
    assert cluster["global_step"] == alone["global_step"] == 20
    for name in ("hidden/kernel", "out/kernel", "out/bias"):
        np.testing.assert_allclose(cluster[name], alone[name], rtol=1e-5, atol=1e-6)


# ====================================================================== TF 1.14's tf.distribute.experimental
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tf_1_14s_parameter_server_strategy_scope_trains_a_keras_model_shared_on_the_ps(tmp_path):
    # TF 1.14 itself refused Keras under this strategy ("currently only works with the tf.Estimator API").
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "keras_tf14.py", ["--ps", "1", "--workers", "2"], ["--strategy", "ps"])
    assert_clean_exit(run)
    assert re.search(r"^\[worker:0\] tfcluster: info: ParameterServerStrategy\.scope\(\): ParameterServerStrategy: 1 "
                     r"replica\(s\) per worker on /cpu:0 \(no GPU, none asked for\); variables on the ps tasks",
                     run.out, re.M), run.out[-3000:]
    # 64 examples halved between two workers, batches of 8, 2 epochs: 8 updates each, on one shared model.
    assert run.printed("ITER") == {"worker:0": "16", "worker:1": "16"}


def allreduce_alone(tmp_path, *args) -> dict:
    """What keras_distribute.py prints in one process (no TF_CONFIG: one replica): ``{ITER, LOSS, WEIGHTS}``."""
    r = run_tf1(tmp_path, (HERE / "programs" / "keras_distribute.py").read_text(), *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return {word: json.loads(re.search(rf"^{word} (.*)$", r.stdout, re.M).group(1))
            for word in ("ITER", "LOSS", "WEIGHTS")}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("form, entry", [
    ("compile", r"compile\(distribute=\.\.\.\): CollectiveAllReduceStrategy"),
    ("scope", r"MultiWorkerMirroredStrategy\.scope\(\): MultiWorkerMirroredStrategy"),
])
def test_keras_all_reduce_across_two_workers_trains_as_one_process_on_the_global_batch(tmp_path, form, entry):
    # TF 1.11-1.13's compile(distribute=CollectiveAllReduceStrategy()) and TF 1.14's MultiWorkerMirroredStrategy
    # scope, on two workers and no ps: each holds a copy, each update the mean of both workers' gradients.
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "keras_distribute.py", ["--ps", "0", "--workers", "2"], ["--form", form])
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] tfcluster: info: {entry}: 1 replica\(s\) per worker on /cpu:0.*; each of "
                         r"the 2 workers holds a copy", run.out, re.M), run.out[-3000:]
        # The replicas stayed in step: the copies' checksums agree at the end.
        assert re.search(rf"^\[{worker}\] .*{worker}: all 2 workers hold identical variables", run.out, re.M)
    # A global batch of 8 is 4 examples of each worker's 32: 8 updates per epoch, from both workers' gradients.
    assert run.printed("ITER") == {"worker:0": "16", "worker:1": "16"}
    alone = allreduce_alone(tmp_path, "--form", form)
    assert alone["ITER"] == 16
    for task in ("worker:0", "worker:1"):
        for got, want in zip(json.loads(run.printed("WEIGHTS")[task]), alone["WEIGHTS"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert alone["LOSS"][-1] < alone["LOSS"][0]        # it trained


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_keras_all_reduce_averages_batch_norm_state_so_the_copies_stay_identical(tmp_path):
    # Batch norm's moving averages move from each worker's own batch, with no gradient: averaged after each step.
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "keras_distribute.py", ["--ps", "0", "--workers", "2"], ["--form", "scope", "--batchnorm"])
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] .*{worker}: all 2 workers hold identical variables", run.out, re.M), \
            run.out[-3000:]
    weights = {task: json.loads(w) for task, w in run.printed("WEIGHTS").items()}
    moving_mean = weights["worker:0"][4]          # Dense kernel, bias; gamma, beta, moving mean, moving variance
    assert weights["worker:0"] == weights["worker:1"] and any(abs(m) > 1e-3 for m in moving_mean)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_keras_compile_with_parameter_server_strategy_trains_one_model_shared_on_the_ps(tmp_path):
    from test_legacy_programs import Ran, assert_clean_exit
    run = Ran(tmp_path, "keras_distribute.py", ["--ps", "1", "--workers", "2"], ["--form", "ps"])
    assert_clean_exit(run)
    assert re.search(r"^\[worker:0\] tfcluster: info: compile\(distribute=\.\.\.\): ParameterServerStrategy: 1 "
                     r"replica\(s\) per worker on /cpu:0; variables on the ps tasks", run.out, re.M), run.out[-3000:]
    # Each worker's update is its own batch of 8 (async): 32 examples each, 2 epochs, 8 updates each, one model.
    assert run.printed("ITER") == {"worker:0": "16", "worker:1": "16"}
    weights = run.printed("WEIGHTS")
    assert weights["worker:0"] == weights["worker:1"]         # both read the one trained model after fit


@pytest.mark.timeout(120)
def test_keras_all_reduce_cuts_a_graph_mode_dataset_to_a_multiple_of_the_workers(tmp_path):
    # Every worker must take the same number of steps: 5 batches over 2 workers become 4 (a TF1 mode dataset's
    # length is a graph tensor, read in its own graph).
    text = r"""
import tensorflow as tf
from tfcluster.keras.collective import even
batches = tf.data.Dataset.range(5).batch(1)
cut = even(batches, 2)
with tf.Session() as session:
    print("LENGTHS", session.run(cut.cardinality()), session.run(even(batches.repeat(), 2).cardinality()))
"""
    r = run_tf1(tmp_path, text)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^LENGTHS 4 -1$", r.stdout, re.M), r.stdout[-2000:]


@pytest.mark.timeout(120)
def test_keras_all_reduce_needs_a_global_batch_that_splits_over_the_workers(tmp_path):
    env = base_env(TF_CONFIG=json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                                         "task": {"type": "worker", "index": 0}}))
    text = (HERE / "programs" / "keras_distribute.py").read_text().replace("batch_size=8", "batch_size=7")
    r = run_tf1(tmp_path, text, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("tfcluster: error:")]
    assert errors == ["tfcluster: error: fit(batch_size=7) is the global batch under all-reduce, split over 2 "
                      "workers: give a multiple of 2"], r.stderr[-2000:]


@pytest.mark.timeout(150)
def test_tf_1_14s_multi_worker_mirrored_strategy_in_a_run_config_trains_a_model_fn(tmp_path):
    # Alone (no TF_CONFIG) it is one replica on the CPU; across workers the Estimator all-reduces (test above).
    r, result = custom_run(tmp_path, "tf.distribute.experimental.MultiWorkerMirroredStrategy()", 10)
    assert result["global_step"] == 20
    assert re.search(r"^tfcluster: info: RunConfig\(train_distribute=\.\.\.\): MultiWorkerMirroredStrategy: 1 "
                     r"replica\(s\) per worker on /cpu:0", r.stderr, re.M), r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_parameter_server_strategy_with_two_replicas_per_worker_trains_towers_on_each_worker_shared_on_the_ps(
        tmp_path):
    # TF 1.x's multi-GPU parameter-server setup: each worker splits its steps over its replicas (2 virtual CPU
    # devices here), their gradients summed into one update of the variables on the ps.
    from test_legacy_programs import Ran, assert_clean_exit, assert_one_global_step_counts_every_step
    run = Ran(tmp_path, "estimator_custom.py", ["--ps", "1", "--workers", "2", "--evaluator"],
              # Long enough for worker:1 to join: it starts seconds after the chief, who steps ~200 times a second.
              ["--model_dir", str(tmp_path / "model"), "--max_steps", "3000", "--towers", "2"])
    assert_clean_exit(run)
    for worker in ("worker:0", "worker:1"):
        assert re.search(rf"^\[{worker}\] tfcluster: info: model_fn runs on 2 tower\(s\) on /device:CPU:0, "
                         r"/device:CPU:1 \(virtual CPU devices\), one update per step from all of them$", run.out,
                         re.M), run.out[-3000:]
    steps = {task: int(n.split()[-1]) for task, n in run.printed("STEPS").items()}
    assert set(steps) == {"worker:0", "worker:1"} and min(steps.values()) > 0      # both trained
    assert_one_global_step_counts_every_step(tmp_path / "model", steps)          # one shared model
    assert json.loads(run.printed("EVAL")["evaluator:0"])["accuracy"] > 0.8
