"""The input resumes where it stopped: a resumed run reads each example as often as an uninterrupted one.

The model of ``jobs/ids_job.py`` counts, in a variable its checkpoints hold,
how often each example id reached a training step; each test compares a run
cut into pieces (restarts, a SIGTERM to a whole cluster) with what one
uninterrupted run reads. Real runs of ``fit`` and of the Estimator, real
checkpoints.
"""

import os
import signal
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from conftest import TFCLUSTER, no_process_left  # noqa: E402
from jobs import ids_job  # noqa: E402
from jobs.stream import Stream  # noqa: E402

import tfcluster  # noqa: E402
import tfcluster.estimator  # noqa: E402
from tfcluster.training.input_position import INPUT_DIR  # noqa: E402

IDS = 1000


def fit(ckpt, steps, shuffle_seed=None, input_fn=None):
    """One run of ``fit`` to global step ``steps`` in ``ckpt``, in this process, as a restarted job runs."""
    return tfcluster.fit(ids_job.make_model_fn(IDS), input_fn or ids_job.make_input_fn(IDS, shuffle_seed),
                         optimizer=lambda: tf1.train.GradientDescentOptimizer(0.01), steps=steps, batch_size=10,
                         checkpoint_dir=str(ckpt), save_checkpoint_steps=1000, save_checkpoint_secs=None,
                         log_every_secs=60)


@pytest.mark.timeout(120)
def test_a_resumed_fit_reads_on_where_the_last_run_stopped(tmp_path, said, reliability):
    # The measurement: 50 steps of 10 ids, then the same program resumed to 100 steps.
    fit(tmp_path, 50)
    fit(tmp_path, 100)
    seen = ids_job.seen(tmp_path)
    assert (seen == 1).all(), f"ids read twice: {np.flatnonzero(seen > 1)[:5]}, never: {np.flatnonzero(seen == 0)[:5]}"
    assert "local resumes its input where it stood at global step 50" in said.text
    reliability("input position: examples read twice after a restart at step 50 of 100 (was 500)",
                int((seen > 1).sum()), "examples")


@pytest.mark.timeout(180)
def test_a_shuffled_input_cut_into_three_runs_reads_what_one_run_reads(tmp_path):
    # 1.5 epochs of a seeded shuffle: which ids come twice depends on the whole order, buffer included.
    fit(tmp_path / "whole", 150, shuffle_seed=3)
    for steps in (40, 110, 150):
        fit(tmp_path / "cut", steps, shuffle_seed=3)
    whole, cut = ids_job.seen(tmp_path / "whole"), ids_job.seen(tmp_path / "cut")
    assert whole.sum() == 1500 and (whole == 2).sum() == 500
    np.testing.assert_array_equal(cut, whole)


@pytest.mark.timeout(120)
def test_positions_rotate_with_the_checkpoints_across_restarts(tmp_path):
    for steps in range(10, 90, 10):
        tfcluster.fit(ids_job.make_model_fn(IDS), ids_job.make_input_fn(IDS),
                      optimizer=lambda: tf1.train.GradientDescentOptimizer(0.01), steps=steps, batch_size=10,
                      checkpoint_dir=str(tmp_path), save_checkpoint_steps=1000, save_checkpoint_secs=None,
                      keep_checkpoints=2, log_every_secs=60)
    positions = sorted(f for f in os.listdir(tmp_path / INPUT_DIR / "local") if f.endswith(".index"))
    # Each run saves after its first step and at its end; the rotation knows every run's: keep_checkpoints + 2.
    assert positions == [f"position-{s}.index" for s in (61, 70, 71, 80)]


@pytest.mark.timeout(120)
def test_a_position_that_does_not_fit_a_changed_pipeline_is_named_and_the_input_starts_over(tmp_path, said):
    fit(tmp_path, 20)

    def other_input_fn(ctx):            # the program changed its pipeline between the runs
        return ids_job.make_input_fn(IDS)(ctx).prefetch(4).map(lambda f, y: (f, y))
    fit(tmp_path, 30, input_fn=other_input_fn)
    assert "does not fit this input pipeline" in said.text
    assert "local reads its input from the start" in said.text
    assert ids_job.seen(tmp_path)[:10].tolist() == [2] * 10


@pytest.mark.timeout(120)
def test_a_generator_pipeline_says_at_start_that_it_cannot_resume_and_trains(tmp_path, said):
    def generated(ctx):
        def rows():
            for i in range(IDS):
                yield {"id": i, "x": float(i % 7)}, i % 7 * 0.5
        ds = tf.data.Dataset.from_generator(rows, output_signature=(
            {"id": tf.TensorSpec([], tf.int32), "x": tf.TensorSpec([], tf.float32)}, tf.TensorSpec([], tf.float32)))
        return ds.batch(ctx.per_replica_batch)
    result = fit(tmp_path, 20, input_fn=generated)
    assert result.global_step == 20
    lines = [r.getMessage() for r in said.records if "cannot be saved" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("local: its input pipeline cannot be saved (")
    assert lines[0].endswith("a resumed run reads it from its start")


# ====================================================================== the Estimator
def estimator_run(model_dir, steps):
    def model_fn(features, labels, mode):
        w = tf1.get_variable("w", shape=[], initializer=tf1.zeros_initializer())
        seen = tf1.get_variable("seen", shape=[IDS], dtype=tf.int32, initializer=tf1.zeros_initializer(),
                                trainable=False)
        loss = tf.reduce_mean(tf.square(w * features["x"] - labels))
        count = tf1.scatter_add(seen, features["id"], tf.ones_like(features["id"], tf.int32))
        train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss, tf1.train.get_global_step())
        return tfcluster.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(train, count))

    def input_fn():
        ds = tf.data.Dataset.range(IDS).map(lambda i: ({"id": tf.cast(i, tf.int32), "x": tf.cast(i % 7, tf.float32)},
                                                      tf.cast(i % 7, tf.float32) * 0.5))
        return ds.repeat().batch(10)
    est = tfcluster.estimator.Estimator(model_fn, model_dir=str(model_dir),
                                        config=tfcluster.estimator.RunConfig(save_checkpoints_steps=1000))
    est.train(input_fn, max_steps=steps)


@pytest.mark.timeout(120)
def test_a_resumed_estimator_reads_on_where_the_last_run_stopped(tmp_path, said):
    estimator_run(tmp_path, 50)
    estimator_run(tmp_path, 100)
    assert (ids_job.seen(tmp_path) == 1).all()
    assert "estimator resumes its input where it stood at global step 50" in said.text


# ====================================================================== a cluster, preempted
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_a_cluster_then_a_rerun_reads_every_shard_on_from_where_it_stopped(procs, tmp_path, reliability):
    ckpt = tmp_path / "ckpt"

    def launch(steps):
        cmd = TFCLUSTER + ["local", "--ps", "1", "--workers", "2", "--log-dir", str(tmp_path / f"logs-{steps}"), "--",
                           sys.executable, os.path.join(HERE, "jobs", "ids_job.py"), "--steps", str(steps),
                           "--ckpt", str(ckpt), "--step-sleep", "0.02"]
        return Stream(procs.start(cmd, cwd=str(tmp_path)), f"tfcluster local (to {steps})")

    run = launch(100000)
    run.wait_for(r"\[worker:1\] .*step \d+ \(global (\d+)", 150, check=lambda m: int(m.group(1)) >= 40)
    pids = [int(m.group(1)) for _, m in run.matches(r"started \(pid (\d+)\)")]
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=90) == 143, run.tail(60)
    assert no_process_left(pids, timeout=5)
    stopped = int(ckpt.joinpath("checkpoint").read_text().split('"')[1].rsplit("-", 1)[1])

    target = stopped + 60      # far from the end of either shard (200 batches each): no id is due twice
    again = launch(target)
    assert again.finish(timeout=200) == 0, again.tail(60)
    for task in ("worker:0", "worker:1"):
        assert again.matches(rf"\[{task}\] .*{task} resumes its input where it stood at global step \d+")
    seen = ids_job.seen(ckpt)
    twice = int((seen > 1).sum())
    reliability(f"cluster: examples read twice after a SIGTERM at step {stopped}, resumed to {target}", twice,
                "examples")
    # Every step in the final checkpoint read 10 ids (an async run may end a step past its target).
    final = tf.train.load_variable(tf.train.latest_checkpoint(str(ckpt)), "global_step")
    assert twice == 0 and seen.sum() == 10 * final and final >= target
    # Each worker read a prefix of its shard (ctx.shard: every 2nd id), with no gap where a run stopped.
    for shard in (seen[0::2], seen[1::2]):
        read = int(shard.sum())
        assert (shard[:read] == 1).all() and (shard[read:] == 0).all(), np.flatnonzero(shard)[-5:]
