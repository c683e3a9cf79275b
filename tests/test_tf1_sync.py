"""TF 1.x synchronous programs train under TF1 mode, however they make their sessions.

The programs are written as TF 1.x's docs and tutorials wrote them:
tests/legacy/mnist_replica.py is TensorFlow's own distributed MNIST test
(tf.train.Supervisor, four flags); tests/legacy/sync_sessions.py makes its
session each way the docs showed (Supervisor's prepare_or_wait_for_session and
managed_session, SessionManager, MonitoredTrainingSession with the optimizer's
hook) and trains a linear model on each worker's fixed batch, so the chief's
final weights say whether every global step took exactly one gradient from
each worker: gradient descent on the mean of the workers' gradients, computed
here in numpy, to 1e-4. The ready checks each session maker runs (Supervisor's,
SessionManager's, Scaffold's defaults) report nothing uninitialised once the
chief initialised, whatever variables the sync step adds.
"""

import json
import os
import re
import sys

import numpy as np
import pytest

import forks
from conftest import REPO, base_env, run_local
from test_tf1 import mnist_dir  # noqa: F401  (the MNIST files the tutorial reads)

LEGACY = os.path.join(REPO, "tests", "legacy")
SESSIONS = os.path.join(LEGACY, "sync_sessions.py")
KINDS = ("supervisor", "supervisor-init-first", "managed", "session-manager", "monitored")
#: A sync step that waits this long for a worker fails the run, and the test, with the workers it waited for.
QUICK_STALL = {"TFCLUSTER_SYNC_TIMEOUT_SECS": "60"}


def batch(task):
    """Worker ``task``'s fixed batch, as tests/legacy/sync_sessions.py makes it."""
    rng = np.random.RandomState(task)
    xs = rng.rand(16, 4).astype(np.float32)
    ys = xs.dot(np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)) + task
    return xs.astype(np.float64), ys.astype(np.float64)


def one_gradient_from_each(workers: int, steps: int, learning_rate: float = 0.05):
    """The weights after ``steps`` sync steps that each averaged one gradient from every worker."""
    data = [batch(i) for i in range(workers)]
    w = np.zeros((4, 1))
    for _ in range(steps):
        w -= learning_rate * np.mean([2.0 / len(x) * x.T.dot(x.dot(w) - y) for x, y in data], axis=0)
    return w


def results(output):
    """The chief's RESULT lines."""
    return [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", output)]


def assert_one_gradient_from_each(result, workers):
    steps = result["global step"]
    assert steps >= 10, result
    expected = one_gradient_from_each(workers, steps)
    assert np.allclose(result["w"], expected, atol=1e-4), (
        f"{result['session']}: weights after {steps} steps {np.ravel(result['w'])} are not those of one gradient "
        f"from each of {workers} workers per step {expected.ravel()}")


def done_steps(output):
    """``{worker index: local steps}`` from the workers' closing lines."""
    return {int(t): int(n) for t, n in re.findall(r"worker (\d+): done after (\d+) local steps", output)}


# ------------------------------------------------------------ every worker a thread of one process
@pytest.fixture(scope="module")
def in_one_process():
    """sync_sessions.py run once, every way of making sessions in turn, 1 ps + 2 workers in one process."""
    r = forks.run([sys.executable, "-m", "tfcluster.tf1", SESSIONS, "--session", ",".join(KINDS)],
                  base_env(**QUICK_STALL), cwd=REPO, timeout=200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {res["session"]: res for res in results(r.stdout)}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", KINDS)
def test_the_ready_checks_pass_once_the_chief_initialised_whatever_the_sync_step_added(in_one_process, kind):
    assert in_one_process[kind]["unready"] == {"0": [], "1": []}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", KINDS)
def test_each_global_step_takes_one_gradient_from_each_worker(in_one_process, kind):
    assert_one_gradient_from_each(in_one_process[kind], workers=2)


# ------------------------------------------------------------ clusters of processes
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tensorflows_mnist_replica_trains_in_sync_on_a_cluster_under_legacy_flags(tmp_path, mnist_dir):  # noqa: F811
    code, out = run_local(tmp_path, "--tf1", "--legacy-flags", "--ps", "1", "--workers", "2", "--timeout", "180",
                          "--", "python", os.path.join(LEGACY, "mnist_replica.py"), "--data_dir", mnist_dir,
                          "--sync_replicas", "--train_steps", "60")
    assert code == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    finished = re.findall(r"\[worker:(\d)\] After 60 training step\(s\), validation cross entropy = ([\d.e+]+)", out)
    assert sorted(t for t, _ in finished) == ["0", "1"], out[-3000:]
    # Summed over its 5000 validation images: chance is 5000 * ln 10 = 11,513.
    assert all(float(x) < 6000 for _, x in finished), finished
    # The chief's run pushes, then applies its step: the global step it fetched is the one it pushed for, so
    # in lockstep its k-th run sees global step k - 1, and with two workers no step went without either.
    chief = [(int(k), int(g)) for k, g in re.findall(r"\[worker:0\] \S+: Worker 0: training step (\d+) done "
                                                     r"\(global step: (\d+)\)", out)]
    assert chief and all(g == k - 1 for k, g in chief), chief
    worker = re.findall(r"\[worker:1\] \S+: Worker 1: training step (\d+) done", out)
    assert len(worker) == len(chief), (len(worker), len(chief))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind, workers, legacy", [("managed", 3, []), ("monitored", 2, ["--legacy-flags"])],
                         ids=["supervisor-managed-session-3-workers-tf-config",
                              "monitored-training-session-2-workers-legacy-flags"])
def test_a_sync_program_on_a_cluster_takes_one_gradient_from_each_worker_per_step(tmp_path, kind, workers, legacy):
    code, out = run_local(tmp_path, "--tf1", *legacy, "--ps", "1", "--workers", str(workers), "--timeout", "180",
                          "--", "python", SESSIONS, "--session", kind, "--train_steps", "20")
    assert code == 0, out[-4000:]
    [result] = results(out)
    assert result["unready"] == {"0": []}, result
    assert_one_gradient_from_each(result, workers)
    steps = done_steps(out)
    assert sorted(steps) == list(range(workers)), out[-3000:]        # every worker finished
    assert len(set(steps.values())) == 1, steps                      # and pushed once per global step
