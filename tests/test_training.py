"""fit / evaluate / predict in one process, the model_fn contract, loss scaling, strategy binding.

The multi-process parameter-server behaviour is in test_ps_training.py.
"""

import math
import os
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fit_job as job  # noqa: E402

from tfcluster import Cluster, SpecError  # noqa: E402
from tfcluster.graph.placement import SYNC_STATE_COLLECTION, placement_report  # noqa: E402
from tfcluster.strategies import (InputContext, LocalStrategy, ModelFnError, ModelOutput,  # noqa: E402
                                  ParameterServerStrategy, ReplicaContext, StepRunner, Strategy, TrainGraph, get,
                                  names, register, replica_loss)
from tfcluster.graph.step import global_step_after  # noqa: E402
from tfcluster.strategies.base import build_single_replica  # noqa: E402
from tfcluster.runtime.checkpoints import DONE_MARKER, read_done_marker  # noqa: E402
from tfcluster.training.evaluation import evaluate, predict  # noqa: E402
from tfcluster.training.train import fit  # noqa: E402


def sgd():
    return tf1.train.GradientDescentOptimizer(0.5)


def local_fit(data, ckpt, steps, batch=32, **kw):
    return fit(job.make_model_fn(data), job.make_input_fn(data), optimizer=sgd, steps=steps, batch_size=batch,
               checkpoint_dir=str(ckpt), save_checkpoint_secs=None, log_every_secs=60, **kw)


def checkpoint_weights(path):
    r = tf.train.load_checkpoint(str(path))
    return {k: r.get_tensor(k) for k in job.NAMES}


# ------------------------------------------------------------- loss scaling
def scaled(per_example, ctx, reg=0.0):
    g = tf1.Graph()
    with g.as_default():
        out = ModelOutput(per_example_loss=tf.constant(per_example), regularization_loss=tf.constant(reg))
        s, m = replica_loss(out, ctx)
        with tf1.Session() as sess:
            return sess.run([s, m])


def test_the_loss_is_summed_over_the_replica_and_divided_by_the_global_batch():
    s, m = scaled([1.0, 2.0, 3.0, 4.0], ReplicaContext(num_replicas=2, per_replica_batch=4), reg=1.0)
    assert s == pytest.approx(10.0 / 8 + 1.0 / 2)   # sum / (4 x 2) + regularisation / replicas
    assert m == pytest.approx(2.5 + 1.0)            # the replica's own mean, for progress lines


def test_without_a_known_batch_size_the_global_batch_comes_from_the_actual_batch():
    s, _ = scaled([1.0, 2.0, 3.0], ReplicaContext(num_replicas=3))
    assert s == pytest.approx(6.0 / 9)


def test_a_scalar_loss_is_refused_with_a_message_that_says_what_to_return(data, tmp_path):
    def mean_loss_model(features, labels, mode):
        out = job.make_model_fn(data)(features, labels, mode)
        return ModelOutput(predictions=out.predictions, per_example_loss=tf.reduce_mean(out.per_example_loss))
    with pytest.raises(ModelFnError, match="per example"):
        fit(mean_loss_model, job.make_input_fn(data), optimizer=sgd, steps=1, batch_size=8)


def test_model_fn_must_return_model_output(data):
    with pytest.raises(ModelFnError, match="ModelOutput"):
        fit(lambda f, l, m: {"loss": 1}, job.make_input_fn(data), optimizer=sgd, steps=1, batch_size=8)


# ------------------------------------------------------------ local training
def test_one_process_fit_matches_a_hand_written_tf1_loop(data, tmp_path):
    result = local_fit(data, tmp_path, steps=20, batch=32)
    assert result.global_step == 20 and result.local_steps == 20
    got = checkpoint_weights(result.checkpoint)
    want = job.reference_weights(data, steps=20, batch=32)
    for k in job.NAMES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert not math.isnan(result.loss)


def test_evaluate_and_predict_restore_the_checkpoint_in_a_plain_graph(data, tmp_path):
    local_fit(data, tmp_path, steps=30)
    weights = checkpoint_weights(tf.train.latest_checkpoint(str(tmp_path)))
    x, y = data["x"], data["y"]
    metrics = evaluate(job.make_model_fn(data), job.make_eval_input_fn(data), str(tmp_path))
    assert metrics["global_step"] == 30
    assert metrics["loss"] == pytest.approx(job.mean_loss(weights, x, y), rel=1e-4)
    assert metrics["accuracy"] == pytest.approx(np.mean(job.forward(weights, x).argmax(1) == y))
    preds = predict(job.make_model_fn(data), lambda ctx: tf.data.Dataset.from_tensor_slices(x).batch(100),
                    str(tmp_path))
    np.testing.assert_allclose(preds["logits"], job.forward(weights, x), rtol=1e-4, atol=1e-5)
    assert preds["class"].shape == (len(x),)


def test_fit_resumes_from_the_latest_checkpoint_and_writes_the_done_marker(data, tmp_path):
    local_fit(data, tmp_path, steps=10)
    again = local_fit(data, tmp_path, steps=25)
    assert (again.global_step, again.local_steps) == (25, 15)
    marker = read_done_marker(str(tmp_path))
    assert marker["global_step"] == 25 and marker["checkpoint"].endswith("model.ckpt-25")
    assert os.path.exists(os.path.join(tmp_path, DONE_MARKER))
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path))


def test_a_finished_run_trains_no_further(data, tmp_path):
    local_fit(data, tmp_path, steps=5)
    assert local_fit(data, tmp_path, steps=5).local_steps == 0


def test_evaluate_names_a_missing_checkpoint(data, tmp_path):
    with pytest.raises(SpecError, match="no checkpoint"):
        evaluate(job.make_model_fn(data), job.make_eval_input_fn(data), str(tmp_path))


# --------------------------------------------------------- strategy binding
TWO_WORKERS = {"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]}


def test_strategies_are_found_by_name():
    assert isinstance(get("local"), LocalStrategy)
    assert get("sync").mode == "sync" and get("async").mode == "async"
    with pytest.raises(SpecError, match="unknown strategy"):
        get("allreduce-please")


def test_a_strategy_takes_its_options_by_name_and_an_unknown_one_is_refused_naming_the_known():
    s = get("sync", backups=1, towers=2).bind(Cluster(TWO_WORKERS, ("worker", 0)))
    assert (s.replicas_to_aggregate, s.replicas_per_worker, s.num_replicas_in_sync) == (1, 2, 2)
    with pytest.raises(SpecError, match="no option 'backup'; its options: .*backups"):
        get("sync", backup=1)
    with pytest.raises(SpecError, match="backups=2 leaves no worker"):
        get("sync", backups=2).bind(Cluster(TWO_WORKERS, ("worker", 0)))


class ClippedLocal(Strategy):
    """A whole new strategy in a few lines: one process, each gradient clipped to ``clip`` in norm."""

    name = "clipped"

    def __init__(self, clip=1.0, towers=None):
        super().__init__(towers)
        self.clip = clip

    @property
    def num_replicas_in_sync(self):
        return self.replicas_per_worker

    def build(self, model_fn, next_batch, optimizer, per_replica_batch=None):
        gs, opt, out, mean, grads, updates = build_single_replica(self, model_fn, next_batch, optimizer,
                                                                  per_replica_batch)
        train = opt.apply_gradients([(tf.clip_by_norm(g, self.clip), v) for g, v in grads], global_step=gs)
        return TrainGraph(StepRunner(global_step_after([train] + updates, gs), mean), gs, mean, model=out)


def test_a_new_strategy_is_one_class_and_one_register_line(data, tmp_path):
    register("clipped", ClippedLocal)
    assert get("clipped", clip=0.5).clip == 0.5
    result = local_fit(data, tmp_path / "clipped", 5, strategy="clipped")
    assert result.global_step == 5 and "clipped" in names()


def test_fit_runs_tf_session_run_hooks_and_tfcluster_hooks_around_every_step(data, tmp_path):
    from tfcluster import Hook, RunArgs

    class CountAndFetch(Hook):
        def __init__(self):
            self.calls, self.steps = [], []

        def begin(self):
            self.calls.append("begin")
            self.answer = tf.constant(42)   # a hook may add ops in begin

        def after_create_session(self, session, coord):
            self.calls.append("after_create_session")

        def before_run(self, run_context):
            return RunArgs(self.answer)

        def after_run(self, run_context, run_values):
            self.steps.append((run_values.global_step, int(run_values.results)))

        def end(self, session):
            self.calls.append("end")
    ours = CountAndFetch()
    stop = tf1.train.StopAtStepHook(last_step=7)   # TF's own hook ends the run before fit's 20 steps
    result = local_fit(data, tmp_path / "hooks", 20, hooks=[ours, stop])
    assert result.global_step == 7
    assert ours.calls == ["begin", "after_create_session", "end"]
    assert ours.steps == [(step, 42) for step in range(1, 8)]


def test_fit_options_are_fit_config_fields_and_an_unknown_one_is_refused(data, tmp_path):
    with pytest.raises(SpecError, match="no option 'save_every'; its options: save_checkpoint_steps"):
        local_fit(data, tmp_path / "x", 5, save_every=3)
    with pytest.raises(SpecError, match="keep_checkpoints must be a whole number"):
        local_fit(data, tmp_path / "x", 5, keep_checkpoints=-1)


def test_a_ps_strategy_refuses_a_cluster_without_ps_and_bad_replica_counts():
    with pytest.raises(SpecError, match="needs a cluster with ps"):
        ParameterServerStrategy("sync").bind(Cluster({"worker": ["localhost:1"]}, ("worker", 0)))
    with pytest.raises(SpecError, match="between 1 and the 2"):
        ParameterServerStrategy("sync", replicas_to_aggregate=3).bind(Cluster(TWO_WORKERS, ("worker", 0)))
    with pytest.raises(SpecError, match="mode"):
        ParameterServerStrategy("eventual")
    with pytest.raises(SpecError, match="chief and worker"):
        ParameterServerStrategy("async").bind(Cluster(TWO_WORKERS, ("ps", 0)))


def test_each_worker_reads_its_own_shard_at_the_per_replica_batch():
    s = ParameterServerStrategy("sync").bind(Cluster(TWO_WORKERS, ("worker", 1)))
    ctx = s.input_context(16)
    assert ctx == InputContext(num_input_pipelines=2, input_pipeline_id=1, per_replica_batch=16,
                               num_replicas_in_sync=2)
    assert ctx.global_batch == 32
    with tf1.Graph().as_default(), tf1.Session() as sess:
        got = sess.run(tf1.data.make_one_shot_iterator(ctx.shard(tf.data.Dataset.range(6)).batch(6)).get_next())
    assert list(got) == [1, 3, 5]


def test_backup_workers_make_the_global_batch_of_the_aggregated_replicas_only():
    three = {"worker": ["localhost:1", "localhost:2", "localhost:4"], "ps": ["localhost:3"]}
    s = ParameterServerStrategy("sync", replicas_to_aggregate=2).bind(Cluster(three, ("worker", 2)))
    assert (s.num_replicas_in_sync, s.num_workers, s.worker_index) == (2, 3, 2)
    assert ParameterServerStrategy("async").bind(Cluster(three, ("worker", 0))).num_replicas_in_sync == 3


def test_sync_state_sits_beside_each_variable_and_stays_out_of_checkpoints(data):
    two_ps = dict(TWO_WORKERS, ps=["localhost:3", "localhost:5"])
    s = ParameterServerStrategy("sync").bind(Cluster(two_ps, ("worker", 0)))
    g = tf1.Graph()
    with g.as_default():
        with s.input_scope():
            it = tf1.data.make_one_shot_iterator(job.make_input_fn(data)(s.input_context(8)))
        tg = s.build(job.make_model_fn(data), it.get_next, sgd, 8)
        saver_vars = {v.op.name for v in tf1.global_variables()}
        report = placement_report(g)
    state = g.get_collection(SYNC_STATE_COLLECTION)
    assert {v.op.name for v in state}.isdisjoint(saver_vars)
    by_name = {r.name: r.device for r in report.records}
    for name in job.NAMES:  # one slot per worker, on the variable's own ps
        assert by_name[f"tfcluster_sync/{name}/grad_0"] == by_name[name]
        assert by_name[f"tfcluster_sync/{name}/grad_1"] == by_name[name]
    assert {by_name[n] for n in job.NAMES} == {"/job:ps/task:0", "/job:ps/task:1"}
    assert len(tg.chief_local_init_ops) == len(state) - 2 + 1  # slots if missing, then reset stamps + wake


# ------------------------------------------------------------ pitfall 15
def test_a_step_falsely_rejected_as_a_duplicate_is_rerun_and_other_aborts_are_not(caplog):
    from tfcluster.core.duplicates import rerun
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise tf.errors.AbortedError(None, None, "The same RunGraph (Worker) request was received twice.")
        return "ran"
    assert rerun(flaky) == "ran" and len(calls) == 2
    assert "running it again" in caplog.text

    def preempted():
        raise tf.errors.AbortedError(None, None, "Session handle is not found")
    with pytest.raises(tf.errors.AbortedError, match="handle"):
        rerun(preempted)


@pytest.mark.parametrize("applied", [False, True], ids=["before the apply", "after the apply"])
def test_a_sync_chief_step_falsely_rejected_is_run_again_only_if_it_was_not_applied(caplog, applied):
    # The chief pushes, waits and applies in one run; the step's callables stand in for that run.
    from tfcluster.strategies.sync_run import SyncWaits
    waits = object.__new__(SyncWaits)
    runs, global_step = [], [7]

    def first(options=None):
        runs.append(1)
        if len(runs) == 1:
            if applied:
                global_step[0] = 8
            raise tf.errors.AbortedError(None, None, "The same RunGraph (Worker) request was received twice.")
        global_step[0] = 8
        return 8, 0.25
    waits.chief, waits.steps_done, waits.options, waits.tf = True, 0, None, tf
    waits._first = first
    waits._report = lambda: (7, global_step[0], [7, 7])
    waits._settle = lambda: global_step[0]
    waits._loss_now = lambda: 0.5
    got, loss, _, _ = waits.run()
    assert got == 8
    assert len(runs) == (1 if applied else 2)            # never applied twice
    assert loss == (0.5 if applied else 0.25)
    assert ("after the global step moved on" in caplog.text) == applied
