"""Graph-mode tf.keras on a cluster: after ``model.fit`` the program's model is what the cluster trained.

An unchanged TF 1.x-era Keras program (tests/programs/keras_state.py) under ``tfcluster local --tf1`` with
one ps and two workers, each fitting its half of the data:

- the optimizer's own update counter, read with ``get_value(model.optimizer.iterations)`` after fit, counts
  every worker's updates, the same on both workers, and so does a callback reading it during fit;
- a ``tf.keras.optimizers.schedules`` learning rate decays by that shared count;
- both workers' models end with the same weights;
- a model whose input shape is known only from the data (a ``Sequential`` without ``input_shape``), a
  ``tf.data.Dataset`` as input, sample weights and a TF 1.x ``tf.train`` optimizer all train shared;
- an eager-only tf-keras optimizer is refused in one line;
- a restarted run whose newest checkpoint is truncated resumes from the older one, as ``fit``'s does.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import TFCLUSTER, base_env

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "programs", "keras_state.py")
#: 256 examples, halved between two workers, batches of 16 (or 8 steps of a dataset), 2 epochs.
UPDATES_PER_WORKER = 16

pytestmark = pytest.mark.slow


def run_state(tmp_path, *args, launcher=()):
    """``{worker: its STATE after fit}`` and ``{worker: [update count at each epoch's end]}`` of one run (and,
    with ``launcher`` options, its output)."""
    cmd = TFCLUSTER + ["local", "--tf1", "--ps", "1", "--workers", "2", "--log-dir", str(tmp_path / "logs"),
                       *launcher, "--", sys.executable, PROGRAM, *args]
    r = subprocess.run(cmd, cwd=str(tmp_path), env=base_env(), capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    states = {m.group(1): json.loads(m.group(2)) for m in re.finditer(r"^\[(worker:\d)\] STATE (.*)$", out, re.M)}
    epochs = {}
    for m in re.finditer(r"^\[(worker:\d)\] EPOCH_END \d+ (\d+)$", out, re.M):
        epochs.setdefault(m.group(1), []).append(int(m.group(2)))
    assert set(states) == {"worker:0", "worker:1"}, out[-4000:]
    return (states, epochs, out) if launcher else (states, epochs)


@pytest.fixture(scope="module")
def state_run(tmp_path_factory):
    return run_state(tmp_path_factory.mktemp("keras_state"))


def test_after_fit_the_optimizers_update_count_is_every_workers_on_both_workers(state_run):
    states, _ = state_run
    assert [s["iterations"] for s in states.values()] == [2 * UPDATES_PER_WORKER] * 2


def test_during_fit_a_callback_reads_the_shared_update_count(state_run):
    _, epochs = state_run
    # The worker that ends last sees both workers' updates at its last epoch's end, more than its own.
    assert max(counts[-1] for counts in epochs.values()) == 2 * UPDATES_PER_WORKER


def test_a_learning_rate_schedule_decays_by_the_shared_update_count(state_run):
    states, _ = state_run
    shared = 0.1 * 0.5 ** (2 * UPDATES_PER_WORKER / 10)       # ExponentialDecay(0.1, decay_steps=10, rate 0.5)
    for s in states.values():
        assert s["lr"] == pytest.approx(shared, rel=1e-5)
        assert s["lr"] != pytest.approx(0.1 * 0.5 ** (UPDATES_PER_WORKER / 10), rel=1e-3)   # not its own count


def test_both_workers_models_end_with_the_same_weights(state_run):
    states, _ = state_run
    a, b = states.values()
    assert a["digest"] == b["digest"] and a["accuracy"] == b["accuracy"]


@pytest.mark.parametrize("args", [("--deferred", "--dataset"), ("--sample-weight", "--tf-optimizer")],
                         ids=["no input shape, a dataset", "sample weights, a tf.train optimizer"])
def test_models_built_from_the_data_datasets_sample_weights_and_tf1_optimizers_train_shared(tmp_path, args):
    states, _ = run_state(tmp_path, *args)
    a, b = states.values()
    assert a["iterations"] == b["iterations"] == 2 * UPDATES_PER_WORKER
    assert a["digest"] == b["digest"]


def test_an_eager_only_optimizer_is_refused_in_one_line(tmp_path):
    cmd = TFCLUSTER + ["local", "--ps", "1", "--workers", "1", "--log-dir", str(tmp_path / "logs"), "--",
                       sys.executable, os.path.join(HERE, "jobs", "keras_job.py"), "--epochs", "1",
                       "--new-optimizer"]
    r = subprocess.run(cmd, cwd=str(tmp_path), env=base_env(), capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert re.search(r"^\[worker:0\] keras_job: error: tf_keras\.optimizers\.SGD is eager-only; a graph-mode model "
                     r"trains with tf_keras\.optimizers\.legacy\.SGD", out, re.M), out[-3000:]
    assert "Traceback" not in out


def test_a_restarted_keras_run_falls_back_to_an_older_checkpoint_when_the_newest_is_truncated(tmp_path):
    # The checkpoint-restarts sequence under Keras: two runs of one run id (the second resumes the first), the
    # newest checkpoint truncated and the state file listing it alone, then a third run.
    def run(epochs):
        return run_state(tmp_path, "--epochs", str(epochs), launcher=("--run-id", "restarts"))
    assert run(1)[0]["worker:0"]["iterations"] == UPDATES_PER_WORKER
    assert run(1)[0]["worker:0"]["iterations"] == 2 * UPDATES_PER_WORKER        # resumed
    ckpt = next(tmp_path.glob("tfcluster-keras/restarts/*"))
    newest = f"model.ckpt-{2 * UPDATES_PER_WORKER}"
    (ckpt / "checkpoint").write_text(f'model_checkpoint_path: "{newest}"\nall_model_checkpoint_paths: "{newest}"\n')
    data = next(ckpt.glob(newest + ".data-*"))
    data.write_bytes(data.read_bytes()[:20])
    states, _, out = run(1)
    # From the older one: one run's updates lost, not all of them.
    assert states["worker:0"]["iterations"] == 2 * UPDATES_PER_WORKER
    assert re.search(rf"worker:0 restored \S*/model\.ckpt-{UPDATES_PER_WORKER} instead of the newest checkpoint, "
                     rf"\S*/{newest}, which cannot be read", out), out[-4000:]
    assert (ckpt / "unreadable" / data.name).exists()
