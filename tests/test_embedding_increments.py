"""Incremental saves of embedding variables: between full checkpoints, only the rows written since the last save.

A restore of a full checkpoint applies the increments saved after it, in
order; an increment that cannot be read ends the restore at the one before it,
in one line (docs/embeddings.md, "Incremental saves").
"""

import glob
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import tfcluster
from conftest import REPO, base_env
from tfcluster.embedding.increments import Increments, increments_dir

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1
EVERY = list(range(200)) + [500, 600]


def _graph():
    """An embedding variable (ids admitted at their second sight) and a dense weight, trained toward ones."""
    graph = tf1.Graph()
    with graph.as_default():
        step = tf1.train.get_or_create_global_step()
        option = tfcluster.EmbeddingVariableOption(filter_option=tfcluster.CounterFilter(filter_freq=2))
        ev = tfcluster.get_embedding_variable("ev", 4, partitions=2, seed=1, ev_option=option)
        scale = tf1.get_variable("scale", [4], initializer=tf1.ones_initializer())
        ids = tf1.placeholder(tf.int64, [None])
        rows = tfcluster.embedding_lookup(ev, ids)
        loss = tf.reduce_sum(tf.square(rows * scale - 1.0))
        train = tf1.train.AdagradOptimizer(0.3).minimize(loss, global_step=step)
        saver = tf1.train.Saver()
    return graph, ids, rows, train, saver


def _state(session, graph, ids, rows):
    with graph.as_default():
        scale = [v for v in tf1.global_variables() if v.op.name == "scale"][0]
        step = tf1.train.get_global_step()
    return session.run([rows, scale, step], {ids: EVERY})


def _assert_same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == want[2]


def test_a_restore_is_the_full_checkpoint_plus_every_increment_after_it_each_holding_only_rows_written_since(
        tmp_path):
    graph, ids, rows, train, saver = _graph()
    increments = Increments(graph, sharded=False)
    rng = np.random.RandomState(0)
    with tf1.Session(graph=graph) as session:
        session.run(tf1.global_variables_initializer())
        for _ in range(5):
            session.run(train, {ids: rng.randint(0, 200, 400)})
        full = saver.save(session, str(tmp_path / "model.ckpt"), global_step=5)
        for i in range(3):      # 500 is admitted at its second sight; 600, seen once, waits
            session.run(train, {ids: [1, 2, 3, 500] + ([600] if i == 0 else [])})
        first = increments.save(session, full, 8)
        at_first = _state(session, graph, ids, rows)
        session.run(train, {ids: [4, 1]})
        session.run(train, {ids: [4, 1]})
        second = increments.save(session, full, 10)
        want = _state(session, graph, ids, rows)
    assert os.path.dirname(first) == increments_dir(full) == os.path.dirname(second)
    saved = tf.train.load_checkpoint(first)
    keys = sorted(saved.get_tensor("ev/part_0-keys").tolist() + saved.get_tensor("ev/part_1-keys").tolist())
    waiting = saved.get_tensor("ev/part_0-keys_filtered").tolist()
    assert keys == [1, 2, 3, 500] and waiting == [600]
    saved = tf.train.load_checkpoint(second)
    assert sorted(saved.get_tensor("ev/part_0-keys").tolist() + saved.get_tensor("ev/part_1-keys").tolist()) == [1, 4]
    assert saved.get_tensor("ev/part_0-keys_filtered").tolist() == []
    assert "ev/initial_values" not in saved.get_variable_to_dtype_map()       # never changes: the full one holds it

    graph, ids, rows, train, saver = _graph()
    with tf1.Session(graph=graph) as session:
        saver.restore(session, full)
        _assert_same(_state(session, graph, ids, rows), want)
        session.run(train, {ids: EVERY})        # slots and counts came back too: one more step matches
        after = _state(session, graph, ids, rows)
    graph, ids, rows, train, saver = _graph()
    with tf1.Session(graph=graph) as session:
        session.run(tf1.global_variables_initializer())
        saver.restore(session, full)
        session.run(train, {ids: EVERY})
        _assert_same(_state(session, graph, ids, rows), after)

    # The last increment cut short: the restore ends at the one before it, in one line, and sets it aside.
    data = glob.glob(second + ".data-*")[0]
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    graph, ids, rows, train, saver = _graph()
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("tfcluster").addHandler(handler)
    try:
        with tf1.Session(graph=graph) as session:
            saver.restore(session, full)
            _assert_same(_state(session, graph, ids, rows), at_first)
    finally:
        logging.getLogger("tfcluster").removeHandler(handler)
    said = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(said) == 1 and said[0].startswith(
        "checkpoints: increment model.ckpt-10 of model.ckpt-5 cannot be read (") and "up to step 8" in said[0]
    assert not os.path.exists(second + ".index") and os.path.exists(os.path.join(increments_dir(full), "unreadable"))


def _fit(checkpoint_dir, steps, **options):
    """``fit`` in one process: ids 0-999 in an embedding variable and a dense weight; full saves every 10 steps."""
    def model_fn(features, labels, mode):
        ev = tfcluster.get_embedding_variable("ev", 4, seed=1)
        weight = tf1.get_variable("weight", [4], initializer=tf1.ones_initializer())
        logits = tf.reduce_sum(tfcluster.embedding_lookup(ev, features) * weight, 1)
        return tfcluster.ModelOutput(predictions=logits, per_example_loss=tf.square(logits - labels))

    def input_fn(ctx):
        ids = np.random.RandomState(0).randint(0, 1000, 20000)
        return tf.data.Dataset.from_tensor_slices((ids, (ids % 2).astype(np.float32))).repeat().batch(
            ctx.per_replica_batch)
    return tfcluster.fit(model_fn, input_fn, steps=steps, batch_size=16, optimizer=lambda: tf1.train.AdagradOptimizer(0.1),
                         checkpoint_dir=str(checkpoint_dir), save_checkpoint_steps=10, save_checkpoint_secs=None,
                         summary_steps=None, **options)


def test_fit_saves_increments_between_its_full_checkpoints_and_a_restart_resumes_from_the_last_increment(
        tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tfcluster")
    _fit(tmp_path, 28, save_incremental_checkpoint_steps=3)
    full = str(tmp_path / "model.ckpt-20")
    increments = sorted(os.path.basename(p)[:-len(".index")]
                        for p in glob.glob(os.path.join(increments_dir(full), "*.index")))
    assert increments == ["model.ckpt-23", "model.ckpt-26"]
    assert "local saved increment model.ckpt-26 of model.ckpt-20" in caplog.text
    assert not os.path.exists(increments_dir(str(tmp_path / "model.ckpt-0")))     # gone with its full checkpoint
    # The final checkpoint lost (a crash before it): the restart restores model.ckpt-20 and both increments.
    for path in glob.glob(str(tmp_path / "model.ckpt-28*")):
        os.remove(path)
    caplog.clear()
    result = _fit(tmp_path, 30, save_incremental_checkpoint_steps=3)
    assert "checkpoints: applied 2 increment(s) after model.ckpt-20, up to global step 26" in caplog.text
    assert result.local_steps == 4


def test_a_saved_model_export_serves_the_trained_rows_and_the_default_for_ids_never_admitted(tmp_path):
    from tfcluster import estimator as est

    def model_fn(features, labels, mode, params):
        option = tfcluster.EmbeddingVariableOption(filter_option=tfcluster.CounterFilter(filter_freq=2))
        ev = tfcluster.get_embedding_variable("ev", 4, seed=1, ev_option=option)
        rows = tfcluster.embedding_lookup(ev, features["id"])
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions={"row": rows})
        loss = tf.reduce_sum(tf.square(rows - 1.0))
        train = tf1.train.AdagradOptimizer(0.3).minimize(loss, global_step=tf1.train.get_global_step())
        return est.EstimatorSpec(mode, loss=loss, train_op=train)

    ids = np.array([1, 2, 3, 1, 2, 7] * 4 + [9])             # 9: seen once, never admitted
    estimator = est.Estimator(model_fn, model_dir=str(tmp_path / "model"))
    estimator.train(est.inputs.numpy_input_fn({"id": ids}, batch_size=25, num_epochs=1, shuffle=False))
    with tf1.Graph().as_default():
        receiver = est.export.build_raw_serving_input_receiver_fn({"id": tf1.placeholder(tf.int64, [None])})
    path = estimator.export_saved_model(str(tmp_path / "export"), receiver)
    asked = np.array([1, 2, 3, 7, 9, 12345], np.int64)
    served = tf.saved_model.load(path.decode()).signatures["serving_default"](id=tf.constant(asked))["row"].numpy()
    expected = np.stack([p["row"] for p in estimator.predict(est.inputs.numpy_input_fn({"id": asked}, shuffle=False))])
    np.testing.assert_array_equal(served, expected)
    assert (served[:4] != 0).all() and (served[4:] == 0).all()     # trained rows; the default for 9 and 12345


@pytest.mark.timeout(120)
def test_a_deeprec_estimator_asking_for_incremental_checkpoints_runs_unchanged_in_tf1_mode(tmp_path):
    # DeepRec's docs: Saver and Scaffold(incremental_save_restore=True), a chief
    # CheckpointSaverHook(incremental_save_secs=1); full checkpoints every 100 steps, 20 ms a step.
    program = os.path.join(REPO, "tests", "legacy", "deeprec_estimator_increments.py")
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf1", program, "--model_dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=110, env=base_env())
    assert r.returncode == 0, r.stderr[-3000:]
    final = json.loads(r.stdout.split("FINAL ", 1)[1])
    assert final["step"] == 250
    # trained toward id % 3 (from a random initial matrix: no seed, as in DeepRec's docs)
    np.testing.assert_allclose(final["logits"], [0, 1, 2, 0, 1, 2], atol=0.25)
    for full in (0, 100, 200):      # increments between each pair of full checkpoints
        assert glob.glob(os.path.join(increments_dir(str(tmp_path / f"model.ckpt-{full}")), "*.index")), full
