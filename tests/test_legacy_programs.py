"""TF 1.x programs of the three classes users have, unchanged, on a cluster: ``tfcluster local --tf1``.

- an Estimator program (custom ``model_fn``, ``numpy_input_fn``, ``train_and_evaluate``, a user's
  ``SessionRunHook``, a ``LatestExporter``), with a chief, a worker, a ps and an evaluator;
- a program that turns a compiled tf.keras model into an Estimator (``model_to_estimator``);
- the tutorials' Keras program (``Sequential``, ``compile``, ``fit``, ``evaluate``), with 2 workers and a ps;
- sync runs: an Estimator with ``SyncReplicasOptimizer`` over both trainers, the Keras program with
  ``--strategy sync``.

Each must exit 0 with every task gone; training must have been shared (the steps the trainers ran add up to
the global step on the ps); what it leaves must restore in one plain process and give the same predictions
(and the Estimator's exported SavedModel must serve the same in TF 2); the sync run must end at exactly the
weights one process gets on the global batch.
"""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import forks
from conftest import TFCLUSTER, base_env, no_process_left

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = os.path.join(HERE, "programs")
PY = sys.executable

pytestmark = pytest.mark.slow


class Ran:
    """One finished ``tfcluster local --tf1`` run: its exit code, its output, its dirs."""

    def __init__(self, tmp, program, tasks, args):
        self.tmp, self.program = tmp, os.path.join(PROGRAMS, program)
        cmd = TFCLUSTER + ["local", "--tf1", "--log-dir", str(tmp / "logs"), *tasks, "--", PY, self.program, *args]
        r = subprocess.run(cmd, cwd=str(tmp), env=base_env(), capture_output=True, text=True, timeout=280)
        self.code, self.out = r.returncode, r.stdout + r.stderr
        self.pids = [int(p) for p in re.findall(r"started \(pid (\d+)\)", self.out)]

    def printed(self, word) -> dict:
        """``{task: rest of line}`` of the lines ``[task] WORD rest``."""
        return {m.group(1): m.group(2) for m in re.finditer(rf"^\[(\S+)\] {word} (.*)$", self.out, re.M)}

    def restore(self, model_dir, *more) -> dict:
        """What the program's model gives in one plain process, restored from ``model_dir``."""
        out = self.tmp / "restored.json"
        r = forks.run([PY, "-m", "tfcluster.tf1", os.path.join(PROGRAMS, "restore.py"), self.program, model_dir, out,
                       *more], base_env(), cwd=self.tmp, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        with open(out) as f:
            return json.load(f)


def checkpoint_value(model_dir, name):
    import tensorflow as tf
    return tf.train.load_variable(tf.train.latest_checkpoint(str(model_dir)), name)


def assert_one_global_step_counts_every_step(model_dir, steps: dict):
    """One model shared by the trainers: its global step (on the ps) counts each trainer's steps (``steps``).

    TF 1.x's optimizers increment it with an unlocked ``assign_add``, so two async trainers' increments at the
    same moment can count once (CI-36: 3001 for 3002 steps, both trainers done before the final save): one
    per thousand steps is allowed, and two.
    """
    total = sum(steps.values())
    assert 0 <= total - checkpoint_value(model_dir, "global_step") <= 2 + total // 1000, steps


def assert_clean_exit(run):
    assert run.code == 0, run.out[-4000:]
    assert no_process_left(run.pids), "a task outlived the run"
    assert "[tfcluster] done: 2 trainer(s) succeeded" in run.out


# ============================================================== Estimator
@pytest.fixture(scope="module")
def estimator_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("estimator")
    return Ran(tmp, "estimator_custom.py", ["--ps", "1", "--workers", "1", "--chief", "--evaluator"],
               ["--model_dir", str(tmp / "model"), "--max_steps", "400"])


def test_an_estimator_program_runs_unchanged_with_a_chief_a_worker_a_ps_and_an_evaluator(estimator_run):
    assert_clean_exit(estimator_run)
    assert "[ps:0]" in estimator_run.out and "every trainer is done; ps:0 exits" in estimator_run.out
    evaluation = json.loads(estimator_run.printed("EVAL")["evaluator:0"])
    assert evaluation["global_step"] >= 400 and evaluation["accuracy"] > 0.8


def test_both_estimator_trainers_updated_the_same_variables_on_the_ps(estimator_run):
    steps = {task: int(n.split()[-1]) for task, n in estimator_run.printed("STEPS").items()}
    assert set(steps) == {"chief:0", "worker:0"} and min(steps.values()) > 0
    # Async: every step of either trainer is one update of the one global step on the ps.
    assert_one_global_step_counts_every_step(estimator_run.tmp / "model", steps)


def test_the_estimator_checkpoint_restores_in_one_process_and_its_export_serves_the_same(estimator_run):
    import tensorflow as tf
    restored = estimator_run.restore(estimator_run.tmp / "model")
    evaluation = json.loads(estimator_run.printed("EVAL")["evaluator:0"])
    assert restored["eval"] == pytest.approx(evaluation)      # the evaluator's metrics, from the same checkpoint
    export = sorted(glob.glob(str(estimator_run.tmp / "model" / "export" / "latest" / "*")))[-1]
    served = tf.saved_model.load(export).signatures["serving_default"](
        x=tf.constant(restored["examples"], tf.float32))
    np.testing.assert_allclose(served["logits"].numpy(), np.array(restored["predictions"]), rtol=1e-5, atol=1e-6)


# ====================================================== model_to_estimator
@pytest.fixture(scope="module")
def keras_estimator_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keras_estimator")
    return Ran(tmp, "keras_to_estimator.py", ["--ps", "1", "--workers", "1", "--chief", "--evaluator"],
               ["--model_dir", str(tmp / "model"), "--max_steps", "300"])


def test_a_model_to_estimator_program_runs_unchanged_and_trains_shared(keras_estimator_run):
    run = keras_estimator_run
    assert_clean_exit(run)
    steps = {task: int(n.split()[-1]) for task, n in run.printed("STEPS").items()}
    assert set(steps) == {"chief:0", "worker:0"} and min(steps.values()) > 0
    assert_one_global_step_counts_every_step(run.tmp / "model", steps)
    evaluation = json.loads(run.printed("EVAL")["evaluator:0"])
    assert evaluation["acc"] > 0.8
    restored = run.restore(run.tmp / "model")
    assert restored["eval"] == pytest.approx(evaluation)


# =========================================================== tf.keras fit
@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keras")
    return Ran(tmp, "keras_tutorial.py", ["--ps", "1", "--workers", "2"], ["--out", str(tmp / "weights-{task}.npz")])


def test_the_tutorials_keras_program_runs_unchanged_with_two_workers_and_a_ps(keras_run):
    assert_clean_exit(keras_run)
    accuracies = re.findall(r"Test accuracy: (\S+)", keras_run.out)
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1]      # both workers end with the one model
    # Progress bars reach the terminal as they come, a line at a time, with their task.
    assert re.search(r"^\[worker:1\] +32/512 \[>\.+\] - ETA", keras_run.out, re.M)


def test_the_keras_run_has_no_misleading_lines_from_tf_keras_or_the_ps(keras_run):
    # The launcher sets OMP_NUM_THREADS for OpenMP, not for tf-keras, which warned of it at each session.
    assert "OMP_NUM_THREADS" not in keras_run.out
    # The launcher stops the ps once both trainers exited: it has no one to drain for, and says nothing of it.
    assert "got SIGTERM" not in keras_run.out
    assert "[ps:0] " in keras_run.out and re.search(r"^\[ps:0\] .*ps:0 stopped \(signal\)$", keras_run.out, re.M)


def keras_checkpoints(run):
    """The chief's default checkpoint dir: tfcluster-keras/<the run's id>/<the model's name>."""
    run_id = re.search(r"^\[tfcluster\] run: (\S+) ", run.out, re.M).group(1)
    return run.tmp / "tfcluster-keras" / run_id / "sequential"


def test_both_keras_workers_updated_the_same_variables_on_the_ps(keras_run):
    # Each worker fits 3 epochs of its half (512 examples, batches of 32): 48 steps each.
    updates = [int(n) for n in re.findall(r"the model's optimizer has (\d+) update\(s\) on the ps", keras_run.out)]
    assert updates == [96, 96]       # what each worker's model reads after its fit: the shared count
    ckpt = keras_checkpoints(keras_run)
    assert os.path.basename(__import__("tensorflow").train.latest_checkpoint(str(ckpt))) == "model.ckpt-96"
    names = [n for n, _ in __import__("tensorflow").train.list_variables(str(ckpt))]
    iterations = [n for n in names if n.startswith("optimizer/iter")]
    assert iterations and checkpoint_value(ckpt, iterations[0]) == 96


def test_the_keras_checkpoint_restores_into_the_same_model_in_one_process(keras_run):
    # The chief (worker:0) ends with the weights of the final checkpoint, once every worker's fit is over.
    restored = keras_run.restore(keras_checkpoints(keras_run), keras_run.tmp / "weights-worker-0.npz")
    np.testing.assert_allclose(restored["predictions"], restored["predictions_of_weights"], rtol=1e-6)


def test_the_keras_program_trains_in_sync_on_request_one_update_from_both_workers_per_step(tmp_path):
    run = Ran(tmp_path, "keras_tutorial.py", ["--strategy", "sync", "--ps", "1", "--workers", "2"], [])
    assert_clean_exit(run)
    updates = [int(n) for n in re.findall(r"the model's optimizer has (\d+) update\(s\) on the ps", run.out)]
    assert updates == [48, 48]           # 48 steps of each worker made 48 updates, each of both gradients
    accuracies = re.findall(r"Test accuracy: (\S+)", run.out)
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1]      # one model, the same weights


# ================================================================== sync
@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sync")
    return Ran(tmp, "estimator_custom.py", ["--ps", "1", "--workers", "1", "--chief"],
               ["--model_dir", str(tmp / "model"), "--sync", "--max_steps", "40"])


def one_process_on_the_global_batch(steps, lr=0.2, batch=16):
    """Gradient descent on the mean squared error of both trainers' batches at once, as one process does it."""
    rng = np.random.RandomState(0)
    x = rng.rand(512, 4).astype(np.float32)
    y = x.dot(np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)) + 0.1
    shards = [(x[k::2], y[k::2]) for k in range(2)]
    w = np.zeros((4, 1), np.float32)
    for step in range(steps):
        xb = np.concatenate([np.take(s[0], range(step * batch, (step + 1) * batch), axis=0, mode="wrap")
                             for s in shards])
        yb = np.concatenate([np.take(s[1], range(step * batch, (step + 1) * batch), axis=0, mode="wrap")
                             for s in shards])
        w = w - lr * 2 * xb.T.dot(xb.dot(w) - yb) / len(xb)
    return w


def test_a_sync_estimator_run_ends_at_the_weights_of_one_process_on_the_global_batch(sync_run):
    assert_clean_exit(sync_run)
    steps = {task: int(n.split()[-1]) for task, n in sync_run.printed("STEPS").items()}
    assert steps == {"chief:0": 40, "worker:0": 40}       # one gradient from each trainer in every step
    w = checkpoint_value(sync_run.tmp / "model", "w")
    np.testing.assert_allclose(w, one_process_on_the_global_batch(40), rtol=1e-5, atol=1e-6)
