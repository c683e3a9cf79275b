"""In-graph towers in one process: mirrored and central storage, on virtual CPU devices.

The model is the fixed MLP of ``_fit_job.py``, trained with plain SGD; the
reference is one device training on the global batch (per-replica batch x
towers) with a hand-written TF1 loop.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _fit_job as job  # noqa: E402
from conftest import REPO, base_env  # noqa: E402

from tfcluster import Cluster, SpecError  # noqa: E402
from tfcluster.graph.placement import REPLICA_COLLECTION, placement_report  # noqa: E402
from tfcluster.strategies import (CentralStorageStrategy, CollectiveAllReduceStrategy, LocalStrategy,  # noqa: E402
                                  MirroredStrategy, ModelFnError, ModelOutput, ParameterServerStrategy, Towers, get)
from placement_probe import executed_placement, tower_of  # noqa: E402
from tfcluster.training.train import fit  # noqa: E402

BATCH = 16
STEPS = 20


def sgd():
    return tf1.train.GradientDescentOptimizer(0.5)


def train(data, strategy, ckpt, model_fn=None, batch=BATCH, steps=STEPS):
    """fit in this process; returns (result, checkpoint tensors by name)."""
    result = fit(model_fn or job.make_model_fn(data), job.make_input_fn(data), optimizer=sgd, steps=steps,
                 batch_size=batch, strategy=strategy, checkpoint_dir=str(ckpt), save_checkpoint_secs=None,
                 log_every_secs=60)
    r = tf.train.load_checkpoint(result.checkpoint)
    return result, {k: r.get_tensor(k) for k in r.get_variable_to_shape_map()}


def assert_weights(got, want):
    for k in job.NAMES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def built(strategy, data, model_fn=None):
    """A graph with ``strategy``'s training step, outside fit: (graph, TrainGraph, init ops)."""
    g = tf1.Graph()
    with g.as_default():
        it = tf1.data.make_one_shot_iterator(job.make_input_fn(data)(strategy.input_context(BATCH)).repeat())
        tg = strategy.build(model_fn or job.make_model_fn(data), it.get_next, sgd, BATCH)
        init = [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
    return g, tg, init


def session(strategy, g, init):
    sess = tf1.Session(graph=g, config=strategy.configure(tf1.ConfigProto(allow_soft_placement=True)))
    for op in init:  # the towers' copies are initialised from the variables, so after them
        sess.run(op)
    return sess


# ================================================================ equivalence
@pytest.mark.parametrize("towers", [2, 4])
def test_mirrored_towers_on_virtual_cpus_end_at_the_weights_of_one_device_on_the_global_batch(data, tmp_path, towers):
    result, got = train(data, MirroredStrategy(towers), tmp_path)
    assert result.global_step == STEPS
    assert_weights(got, job.reference_weights(data, steps=STEPS, batch=BATCH * towers))
    # The checkpoint holds the model alone: no tower copies, so it restores into a plain model.
    assert set(got) == set(job.NAMES) | {"global_step"}
    assert result.examples_per_sec > 0


def test_central_storage_ends_at_the_weights_of_one_device_on_the_global_batch(data, tmp_path):
    _, got = train(data, CentralStorageStrategy(2), tmp_path)
    assert_weights(got, job.reference_weights(data, steps=STEPS, batch=2 * BATCH))
    assert set(got) == set(job.NAMES) | {"global_step"}


def test_regularisation_counts_once_per_step_however_many_towers(data, tmp_path):
    base = job.make_model_fn(data)

    def l2_model(features, labels, mode):
        out = base(features, labels, mode)
        with tf1.variable_scope(tf1.get_variable_scope(), reuse=True):
            w1 = tf1.get_variable("dense/w1")  # every tower adds the term; only one copy may count
        tf1.add_to_collection(tf1.GraphKeys.REGULARIZATION_LOSSES, 0.05 * tf.reduce_sum(tf.square(w1)))
        return out
    _, towers = train(data, MirroredStrategy(2), tmp_path / "towers", model_fn=l2_model)
    _, alone = train(data, LocalStrategy(), tmp_path / "alone", model_fn=l2_model, batch=2 * BATCH)
    assert_weights(towers, alone)
    with pytest.raises(AssertionError):  # the term matters: without it the weights differ
        assert_weights(towers, job.reference_weights(data, steps=STEPS, batch=2 * BATCH))


# ============================================================ where things run
def devices_of(ran, prefix):
    """The devices on which the nodes named ``prefix...`` ran.

    Names are matched by scope, not by op: grappler may fuse a tower's forward
    MatMul, add and Tanh into one node (with oneDNN it names it ``Tanh``), but it
    leaves each tower's gradient scope in place.
    """
    return {tower_of(d) for d, names in ran.items() for n in names if n.startswith(prefix)}


def test_each_tower_computes_on_its_own_virtual_device_and_holds_its_own_copy(data):
    s = MirroredStrategy(2).bind(None)
    g, tg, init = built(s, data)
    with session(s, g, init) as sess:
        ran = executed_placement(sess, tg.runner.train_fetch)
        for _ in range(4):
            sess.run(tg.runner.train_fetch)
        copies = {v.op.name: v for v in g.get_collection(REPLICA_COLLECTION)}
        primary = {v.op.name: v for v in g.get_collection("trainable_variables")}
        values = sess.run({"primary": primary, "copies": copies})
    assert devices_of(ran, "gradients/") == {"/device:CPU:0"}
    assert devices_of(ran, "tower_1/gradients/") == {"/device:CPU:1"}
    assert {tower_of(d) for d in ran} == {"/device:CPU:0", "/device:CPU:1"}
    # After steps, tower 1's copy is bit for bit the variable: the update was copied to it.
    assert sorted(copies) == sorted(f"tower_1/{k}" for k in job.NAMES)
    for k in job.NAMES:
        assert values["copies"][f"tower_1/{k}"].tobytes() == values["primary"][k].tobytes()
        assert values["copies"][f"tower_1/{k}"].any()


def test_central_storage_keeps_the_variables_on_the_cpu_and_computes_on_the_towers(data):
    s = CentralStorageStrategy(2).bind(None)
    g, tg, init = built(s, data)
    with session(s, g, init) as sess:
        ran = executed_placement(sess, tg.runner.train_fetch)
    where = {name: tower_of(d) for d, names in ran.items() for name in names}
    assert where["dense/w1"] == where["out/w2"] == "/device:CPU:0"
    assert devices_of(ran, "tower_1/gradients/") == {"/device:CPU:1"}
    assert not g.get_collection(REPLICA_COLLECTION)


def test_the_placement_report_shows_every_towers_copy(data):
    s = MirroredStrategy(2).bind(None)
    g, _, _ = built(s, data)
    report = placement_report(g, devices=s.placement_devices())
    totals = report.totals()
    assert set(totals) == {"/device:CPU:0", "/device:CPU:1"}
    model_bytes = sum(r.nbytes for r in report.records if r.name in job.NAMES)
    assert totals["/device:CPU:1"] == model_bytes
    assert "tower_1/dense/w1" in report.format()


# ============================================================= soft placement
SOFT_PLACEMENT_JOB = r"""
import json, os, sys
os.environ["TF_XLA_FLAGS"] = "--tf_xla_enable_xla_devices"  # an XLA_CPU device, which has no string kernels
import numpy as np
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_eager_execution()
sys.path.insert(0, sys.argv[1])
import _fit_job as job
from tfcluster.strategies import CentralStorageStrategy
from placement_probe import executed_placement, tower_of

data = job.make_data(sys.argv[2])
base = job.make_model_fn(data)

def model_fn(features, labels, mode):
    # The labels make a round trip through strings: AsString and StringToNumber have no XLA_CPU kernel.
    return base(features, tf.strings.to_number(tf.strings.as_string(labels), out_type=tf.int64), mode)

s = CentralStorageStrategy(["/cpu:0", "/xla_cpu:0"]).bind(None)
g = tf1.Graph()
with g.as_default():
    it = tf1.data.make_one_shot_iterator(job.make_input_fn(data)(s.input_context(16)).repeat())
    tg = s.build(model_fn, it.get_next, lambda: tf1.train.GradientDescentOptimizer(0.5), 16)
    init = [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
    weights = dict(zip(job.NAMES, tf1.trainable_variables()))
report = {}
for soft in (False, True):
    with tf1.Session(graph=g, config=s.configure(tf1.ConfigProto(allow_soft_placement=soft))) as sess:
        try:
            for op in init:
                sess.run(op)
            ran = executed_placement(sess, tg.runner.train_fetch)
            for _ in range(19):
                sess.run(tg.runner.train_fetch)
        except tf.errors.InvalidArgumentError as e:
            report[str(soft)] = {"error": str(e)}
            continue
        where = {n: tower_of(d) for d, names in ran.items() for n in names}
        want = job.reference_weights(data, 20, 32)
        got = sess.run(weights)
        report[str(soft)] = {"where": where,
                             "max_diff": max(float(np.abs(got[k] - want[k]).max()) for k in job.NAMES)}
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_op_without_a_kernel_on_its_tower_device_runs_on_the_cpu_under_soft_placement(tmp_path):
    script = tmp_path / "soft.py"
    script.write_text(SOFT_PLACEMENT_JOB)
    p = subprocess.run([sys.executable, str(script), HERE, str(tmp_path / "data.npz")], capture_output=True,
                       text=True, timeout=110, env=base_env())
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    # Pinned to the tower without soft placement, the string op cannot run at all...
    assert "tower_1/AsString" in report["False"]["error"]
    assert "no supported kernel for XLA_CPU devices" in report["False"]["error"]
    # ...with it, the string ops fall back to the CPU, the rest of tower 1 runs (compiled) on XLA_CPU:0,
    # and training is unchanged.
    where = report["True"]["where"]
    assert where["tower_1/AsString"] == where["tower_1/StringToNumber"] == "/device:CPU:0"
    assert any(d == "/device:XLA_CPU:0" for d in where.values())
    assert report["True"]["max_diff"] < 1e-5


# ============================================================ bad input, API
def test_towers_take_a_count_or_device_names_and_refuse_nonsense():
    assert Towers(["gpu:1", "/CPU:0", "/device:XLA_CPU:0"]).local_devices == [
        "/device:GPU:1", "/device:CPU:0", "/device:XLA_CPU:0"]
    assert Towers(3).count == 3
    with pytest.raises(SpecError, match="at least 1"):
        Towers(0)
    with pytest.raises(SpecError, match="local to the worker"):
        Towers(["/job:worker/task:0/cpu:0"]).local_devices
    with pytest.raises(SpecError, match="same device twice"):
        Towers(["/cpu:1", "cpu:1"]).local_devices
    with pytest.raises(SpecError, match="not a device name"):
        Towers(["banana"]).local_devices


def test_n_towers_without_gpus_are_n_virtual_cpu_devices_made_through_device_count():
    t = Towers(3)
    assert t.local_devices == ["/device:CPU:0", "/device:CPU:1", "/device:CPU:2"]
    assert t.configure(tf1.ConfigProto()).device_count["CPU"] == 3
    assert Towers(None).local_devices == ["/device:CPU:0"]


def test_strategies_are_found_by_name_and_single_process_ones_refuse_a_cluster():
    assert isinstance(get("mirrored"), MirroredStrategy) and isinstance(get("central"), CentralStorageStrategy)
    assert isinstance(get("collective"), CollectiveAllReduceStrategy)
    two = Cluster({"worker": ["localhost:1", "localhost:2"]}, ("worker", 0))
    with pytest.raises(SpecError, match="trains in one process.*collective"):
        MirroredStrategy(2).bind(two)
    with pytest.raises(SpecError, match="no ps"):
        CollectiveAllReduceStrategy().bind(Cluster({"worker": ["localhost:1"], "ps": ["localhost:3"]},
                                                   ("worker", 0)))


def test_a_variable_a_later_tower_cannot_share_is_refused_with_a_message_that_says_how(data):
    def raw_variable_model(features, labels, mode):
        out = job.make_model_fn(data)(features, labels, mode)
        scale = tf1.Variable(1.0, name="scale")  # not get_variable: towers cannot share it by name
        return ModelOutput(per_example_loss=out.per_example_loss * scale)
    with pytest.raises(ModelFnError, match="get_variable"):
        built(MirroredStrategy(2).bind(None), data, raw_variable_model)


def test_ps_workers_with_towers_keep_the_variables_on_the_ps_and_the_towers_on_the_worker(data):
    cluster = Cluster({"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]}, ("worker", 1))
    s = ParameterServerStrategy("sync", towers=2).bind(cluster)
    assert (s.num_replicas_in_sync, s.input_context(BATCH).global_batch) == (4, 4 * BATCH)
    assert "2 tower(s)" in s.describe()
    g, _, _ = built(s, data)
    ops = {op.name: op.device for op in g.get_operations()}
    for k in job.NAMES:
        assert ops[k] == "/job:ps/task:0"
    assert ops["MatMul"] == "/job:worker/task:1/device:CPU:0"
    assert ops["tower_1/MatMul"] == "/job:worker/task:1/device:CPU:1"
    # Each variable is read once per step into the worker, not once per tower from the ps.
    w1 = [v for v in g.get_collection("trainable_variables") if v.op.name == "dense/w1"][0]
    assert w1.value().device == "/job:worker/task:1/device:CPU:0"
    assert s.configure(tf1.ConfigProto()).device_count["CPU"] == 2


# =================================================================== example
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_digits_example_trains_in_towers_on_2_virtual_devices(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "digits.py"), "--mode", "mirrored",
                        "--devices", "2", "--steps", "150", "--checkpoint-dir", str(tmp_path / "ckpt")],
                       capture_output=True, text=True, timeout=140, env=base_env(), cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "2 tower(s) on /device:CPU:0, /device:CPU:1 (virtual CPU devices)" in out
    # quiet_tensorflow() loads TF with its loading lines (absl's, oneDNN's) hidden: only the run's own lines.
    assert "absl::InitializeLog" not in p.stderr and "oneDNN" not in p.stderr, p.stderr[:2000]
    accuracy = float(out.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.8, out[-2000:]
