"""Checkpoints across restarts: a restore considers every checkpoint on disk, and none is forgotten or lost.

Each test runs ``fit`` in this process, several times over one checkpoint
dir, as a user restarts a job: the files on disk are real TF checkpoints,
truncated for real.
"""

import importlib.util
import os
import sys

import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _fit_job as job  # noqa: E402

import tfcluster  # noqa: E402
import forks
from conftest import base_env  # noqa: E402
from tfcluster.runtime.checkpoints import UNREADABLE_DIR, read_done_marker  # noqa: E402


def run(data, ckpt, steps, **kw):
    """One run of a program that trains to global step ``steps`` in ``ckpt``, as a restarted job would."""
    kw.setdefault("save_checkpoint_steps", 1000)        # a save at the end only, unless a test asks for more
    return tfcluster.fit(job.make_model_fn(data), job.make_input_fn(data),
                         optimizer=lambda: tf1.train.GradientDescentOptimizer(0.5), steps=steps, batch_size=32,
                         checkpoint_dir=str(ckpt), save_checkpoint_secs=None, log_every_secs=60, **kw)


def on_disk(ckpt):
    return sorted(int(f[len("model.ckpt-"):-len(".index")]) for f in os.listdir(ckpt)
                  if f.startswith("model.ckpt-") and f.endswith(".index"))


def listed(ckpt):
    state = tf.train.get_checkpoint_state(str(ckpt))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths]


def truncate(ckpt, step):
    data_file = next(ckpt.glob(f"model.ckpt-{step}.data-*"))
    data_file.write_bytes(data_file.read_bytes()[:20])      # a save cut short, or a disk that lied


def test_a_restart_falls_back_to_a_checkpoint_the_state_file_forgot(data, tmp_path, said, reliability):
    ckpt = tmp_path / "ckpt"
    run(data, ckpt, 30)
    assert run(data, ckpt, 60).local_steps == 30          # resumed at 31
    assert listed(ckpt) == [30, 60]                       # the restarted run's Saver knew model.ckpt-30
    # A state file written by a run that knew only its own checkpoint (TF 1.x's Saver, another tool).
    tf1.train.update_checkpoint_state(str(ckpt), "model.ckpt-60", ["model.ckpt-60"])
    truncate(ckpt, 60)
    result = run(data, ckpt, 62)
    assert (result.global_step, result.local_steps) == (62, 32)     # from model.ckpt-30, not from step 0
    assert "model.ckpt-60 cannot be read" in said.text
    assert f"restored {ckpt}/model.ckpt-30 instead of the newest checkpoint, {ckpt}/model.ckpt-60" in said.text
    # The unreadable one is kept as evidence, out of the rotation.
    assert sorted(os.listdir(ckpt / UNREADABLE_DIR))[0] == "model.ckpt-60.data-00000-of-00001"
    assert on_disk(ckpt) == [30, 62] and listed(ckpt) == [30, 62]
    reliability("restart: steps lost to a truncated checkpoint the state file alone listed", 60 - 30, "steps")


def test_a_dir_whose_checkpoints_all_fail_to_read_stops_the_run_until_starting_over_is_asked_for(
        data, tmp_path, monkeypatch, said):
    ckpt = tmp_path / "ckpt"
    run(data, ckpt, 10, save_checkpoint_steps=5)
    truncate(ckpt, 5)
    truncate(ckpt, 10)
    checkpoint_files = lambda: sorted(f for f in os.listdir(ckpt) if f.startswith("model.ckpt"))  # noqa: E731
    before = checkpoint_files()
    with pytest.raises(tfcluster.TfclusterError) as stopped:
        run(data, ckpt, 20)
    message = str(stopped.value)
    assert stopped.value.exit_code == 2
    assert f"no checkpoint in {ckpt} can be read, so training would start over: model.ckpt-10 (" in message
    assert "model.ckpt-5 (" in message and "set TFCLUSTER_START_OVER=1" in message
    assert "None was moved or deleted" in message and checkpoint_files() == before
    monkeypatch.setenv("TFCLUSTER_START_OVER", "1")
    result = run(data, ckpt, 20)
    assert (result.global_step, result.local_steps) == (20, 20)
    assert f"moved 2 of them to {ckpt}/{UNREADABLE_DIR} and initialising the model" in said.text
    assert sorted(os.listdir(ckpt / UNREADABLE_DIR)) == ["model.ckpt-10.data-00000-of-00001", "model.ckpt-10.index",
                                                         "model.ckpt-5.data-00000-of-00001", "model.ckpt-5.index"]


def test_keep_checkpoints_holds_across_five_restarts(data, tmp_path, reliability):
    ckpt = tmp_path / "ckpt"
    for steps in (10, 20, 30, 40, 50):
        run(data, ckpt, steps, save_checkpoint_steps=5, keep_checkpoints=3)
    assert on_disk(ckpt) == [40, 45, 50] and listed(ckpt) == [40, 45, 50]
    reliability("keep_checkpoints=3 after five restarts: checkpoints on disk", len(on_disk(ckpt)), "files")


def test_an_unreadable_done_marker_is_taken_as_absent_and_said_once(tmp_path, said):
    (tmp_path / "tfcluster_done.json").write_text('{"global_step": 4')         # cut short
    assert read_done_marker(str(tmp_path)) is None
    assert read_done_marker(str(tmp_path)) is None
    assert said.text.count("tfcluster_done.json cannot be read") == 1


def test_an_estimator_restart_falls_back_the_same_way(tmp_path, monkeypatch, said):
    from test_estimator import model_fn, train_input
    from tfcluster import estimator as est
    monkeypatch.delenv("TF_CONFIG", raising=False)
    model_dir = tmp_path / "model"

    def train(max_steps):
        est.Estimator(model_fn, model_dir=str(model_dir), params={"hidden": False},
                      config=est.RunConfig(save_checkpoints_steps=1000, log_step_count_steps=0)).train(
            train_input(), max_steps=max_steps)
    train(30)
    train(60)
    tf1.train.update_checkpoint_state(str(model_dir), "model.ckpt-60", ["model.ckpt-60"])
    truncate(model_dir, 60)
    train(62)
    assert on_disk(model_dir) == [30, 62]
    assert int(tf.train.load_variable(str(model_dir / "model.ckpt-62"), "global_step")) == 62
    assert f"restored {model_dir}/model.ckpt-30 instead of the newest checkpoint" in said.text


KERAS_RESTORE = r'''
import glob, sys
import tensorflow as tf
from tfcluster.keras.checkpoints import KerasSaver
model = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,))])
session = tf.keras.backend.get_session()
saver = KerasSaver(model, sys.argv[1])
path = saver.save(session, sys.argv[1] + "/model.ckpt", 5)
data = glob.glob(path + ".data-*")[0]
open(data, "r+b").truncate(20)
try:
    saver.restore(session, path)
except tf.errors.OpError as e:
    print("RAISED", type(e).__name__)
'''


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="graph-mode Keras needs tf-keras")
def test_a_truncated_keras_checkpoint_fails_to_restore_as_tf_says_a_file_is_unreadable(tmp_path):
    # What the chief's fallback (tests above) recognises: tf-keras's reader says it with an IndexError.
    (tmp_path / "restore.py").write_text(KERAS_RESTORE)
    r = forks.run([sys.executable, "-m", "tfcluster.tf1", "restore.py", tmp_path], base_env(), cwd=tmp_path,
                  timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RAISED OutOfRangeError" in r.stdout
