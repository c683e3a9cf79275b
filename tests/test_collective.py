"""Between-graph training with towers, on real clusters of separate processes.

- Collective all-reduce (no ps): 2 worker processes, with one replica each and
  with 2 towers each, end at the weights of one device training on the global
  batch, every worker's copy is identical, and worker 0's checkpoint restores
  in a plain process.
- A missing peer ends the wait within the stated timeout, naming the peer.
- Parameter servers with towers inside each worker (1 ps + 2 workers, sync).
- The digits example trains with collective all-reduce under ``tfcluster local --ps 0``.

Each cluster is started by hand with TF_CONFIG, the multi-terminal way; this
file is also the workers' script: ``python test_collective.py CONFIG.json``
trains the fixed MLP of ``_fit_job.py`` with plain SGD through
``tfcluster.training.train.fit`` and, at the end, dumps the variables this worker holds.
"""

import json
import os
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _fit_job as job  # noqa: E402

BATCH = 16
STEPS = 20


# =============================================================== the job
def _strategy(cfg):
    from tfcluster.strategies import CollectiveAllReduceStrategy, ParameterServerStrategy
    if cfg["strategy"] == "collective":
        return CollectiveAllReduceStrategy(towers=cfg.get("devices"), timeout_secs=cfg.get("timeout_secs", 120),
                                           startup_timeout_secs=cfg.get("startup_timeout_secs", 120))
    return ParameterServerStrategy(cfg["strategy"], towers=cfg.get("devices"))


def _with_feature_mean(model_fn):
    """The model plus state no gradient touches: an EMA of the features' means, updated through UPDATE_OPS."""
    import tensorflow as tf
    from tfcluster.strategies import Mode
    tf1 = tf.compat.v1

    def fn(features, labels, mode):
        out = model_fn(features, labels, mode)
        if mode == Mode.TRAIN:
            ema = tf1.get_variable("feature_mean", [features.shape[1]], initializer=tf1.zeros_initializer(),
                                   trainable=False)
            tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS,
                                  ema.assign(0.9 * ema + 0.1 * tf.reduce_mean(features, 0)).op)
        return out
    return fn


def feature_mean(data, steps, global_batch):
    """What the EMA of the global batches' feature means is after ``steps`` steps, in numpy."""
    ema = np.zeros(data["x"].shape[1])
    per_pass = len(data["x"]) // global_batch
    for t in range(steps):
        i = (t % per_pass) * global_batch
        ema = 0.9 * ema + 0.1 * data["x"][i:i + global_batch].mean(0)
    return ema


def _dump_at_end(strategy, path):
    """Make the strategy's graph dump this worker's variables (as its own session reads them) at the end."""
    import tensorflow as tf
    from tfcluster.strategies import Hook
    tf1 = tf.compat.v1

    def threads():
        return len(os.listdir("/proc/self/task"))

    class Dump(Hook):
        def __init__(self, variables):
            self.variables, self.after_first_step = {v.op.name: v for v in variables}, None

        def after_run(self, run_context, run_values):
            if self.after_first_step is None:
                self.after_first_step = threads()

        def end(self, session):
            np.savez(path, **session.run(self.variables))
            with open(path[:-len(".npz")] + "-threads.json", "w", encoding="utf-8") as f:
                json.dump({"after_first_step": self.after_first_step, "at_end": threads()}, f)

    build = strategy.build

    def build_and_dump(*args, **kwargs):
        graph = build(*args, **kwargs)
        graph.hooks.append(Dump(tf1.global_variables()))
        return graph
    strategy.build = build_and_dump
    return strategy


def main(config_path):
    """Train as TF_CONFIG's task; write fit's result and this worker's variables to cfg['out']."""
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    import tensorflow as tf
    from tfcluster import TfclusterError
    from tfcluster.core.logs import setup_cli_logging
    from tfcluster.training.train import fit
    setup_cli_logging()
    data = job.load(cfg["data"])
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    name = f"{task['type']}{task['index']}"
    os.makedirs(cfg["out"], exist_ok=True)
    strategy = None
    if task["type"] != "ps":
        strategy = _dump_at_end(_strategy(cfg), os.path.join(cfg["out"], f"{name}.npz"))
    model_fn = job.make_model_fn(data)
    if cfg.get("feature_mean"):
        model_fn = _with_feature_mean(model_fn)
    try:
        result = fit(model_fn, job.make_input_fn(data), strategy=strategy,
                     optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(cfg.get("lr", 0.5)),
                     steps=cfg["steps"], batch_size=cfg["batch"], checkpoint_dir=cfg["checkpoint_dir"],
                     save_checkpoint_secs=None, log_every_secs=1.0, startup_timeout=cfg.get("startup_timeout", 120))
    except TfclusterError as e:
        print(f"job: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    if result is not None:
        with open(os.path.join(cfg["out"], f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(result.__dict__, f, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
    sys.exit(0)


# ============================================================= the tests
from conftest import TFCLUSTER, Procs, base_env  # noqa: E402
from held_ports import REUSE  # noqa: E402

tf = pytest.importorskip("tensorflow")
pytestmark = pytest.mark.slow
SCRIPT = [sys.executable, os.path.abspath(__file__)]


class Run:
    """A cluster started by hand: workers (and a ps) with TF_CONFIG, logs and outputs in ``tmp``."""

    def __init__(self, tmp, procs, ps=0, workers=2, **cfg):
        self.tmp, self.procs = tmp, procs
        ports = procs.ports(ps + workers)
        self.cluster = {"worker": [f"localhost:{p}" for p in ports[:workers]]}
        if ps:
            self.cluster["ps"] = [f"localhost:{p}" for p in ports[workers:]]
        self.data = job.make_data(str(tmp / "data.npz"))
        self.ckpt, self.out = tmp / "ckpt", tmp / "out"
        self.cfg = dict(data=str(tmp / "data.npz"), batch=BATCH, steps=STEPS, checkpoint_dir=str(self.ckpt),
                        out=str(self.out), **cfg)
        (tmp / "cfg.json").write_text(json.dumps(self.cfg))
        self.p = {}

    def start(self, workers=None):
        if "ps" in self.cluster:
            cluster_file = self.tmp / "cluster.json"
            cluster_file.write_text(json.dumps(self.cluster))
            self._start("ps0", TFCLUSTER + ["start", "--cluster", cluster_file, "--job", "ps", "--task", "0"], {})
        for i in range(len(self.cluster["worker"])) if workers is None else workers:
            tf_config = {"cluster": self.cluster, "task": {"type": "worker", "index": i}}
            self._start(f"worker{i}", SCRIPT + [self.tmp / "cfg.json"], {"TF_CONFIG": json.dumps(tf_config)})
        return self

    def _start(self, name, cmd, env):
        with open(self.tmp / f"{name}.log", "w") as out:
            self.p[name] = self.procs.start(cmd, env=base_env(**REUSE, **env), stdout=out, stderr=out)

    def log(self, name) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, timeout, expect=0):
        deadline = time.monotonic() + timeout
        for name, p in self.p.items():
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except Exception:
                raise AssertionError(f"{name} did not exit within {timeout}s; its log:\n{self.log(name)[-3000:]}")
        for name, p in self.p.items():
            assert p.returncode == expect, f"{name} exited {p.returncode}:\n{self.log(name)[-3000:]}"
        return self

    def dump(self, worker) -> dict:
        with np.load(self.out / f"worker{worker}.npz") as d:
            return {k: d[k] for k in d.files}

    def checkpoint(self) -> dict:
        r = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(self.ckpt)))
        return {k: r.get_tensor(k) for k in r.get_variable_to_shape_map()}


@pytest.fixture(scope="module")
def cluster_procs():
    p = Procs()
    yield p
    p.cleanup()


@pytest.fixture(scope="module")
def collective_run(tmp_path_factory, cluster_procs):
    """2 workers, one replica each, no ps; the model keeps an EMA of its input too (state no gradient updates)."""
    return Run(tmp_path_factory.mktemp("collective"), cluster_procs, strategy="collective",
               feature_mean=True).start().wait(150)


@pytest.fixture(scope="module")
def collective_towers_run(tmp_path_factory, cluster_procs):
    """2 workers with 2 towers (virtual CPU devices) each, no ps."""
    return Run(tmp_path_factory.mktemp("collective_towers"), cluster_procs, strategy="collective",
               devices=2).start().wait(150)


def assert_weights(got, want, what):
    for k in job.NAMES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{what}: {k}")


# ================================================================ collective
@pytest.mark.timeout(200)
def test_collective_all_reduce_of_two_workers_matches_one_device_on_the_global_batch(collective_run):
    want = job.reference_weights(collective_run.data, steps=STEPS, batch=2 * BATCH)
    ckpt = collective_run.checkpoint()
    assert int(ckpt["global_step"]) == STEPS
    assert_weights(ckpt, want, "worker 0's checkpoint")
    assert_weights(collective_run.dump(1), want, "worker 1's copy")


@pytest.mark.timeout(200)
def test_after_collective_steps_every_worker_holds_identical_variables(collective_run):
    w0, w1 = collective_run.dump(0), collective_run.dump(1)
    assert set(w0) == set(w1) and set(job.NAMES) <= set(w0)
    for k in w0:  # bit for bit, not to a tolerance: every worker applied the same summed gradient
        assert w0[k].tobytes() == w1[k].tobytes(), k
    assert int(w0["global_step"]) == int(w1["global_step"]) == STEPS
    # Each worker updated the EMA from its own half of the batch; averaged after every step, it is the
    # EMA of the whole global batch's means.
    np.testing.assert_allclose(w0["feature_mean"], feature_mean(collective_run.data, STEPS, 2 * BATCH),
                               rtol=1e-5, atol=1e-6)
    for name in ("worker0", "worker1"):
        assert "all 2 workers hold identical variables" in collective_run.log(name)


@pytest.mark.timeout(200)
def test_a_collective_step_starts_no_thread_so_a_long_fast_run_keeps_its_thread_count(collective_run):
    # TF's per-op collective timeout starts a thread that sleeps the whole timeout at every op
    # (tensorflow/tensorflow#62466): two per step here, and at 400 steps/s a run ran out of threads in 20 s.
    for worker in (0, 1):
        with open(os.path.join(collective_run.out, f"worker{worker}-threads.json"), encoding="utf-8") as f:
            counts = json.load(f)
        assert counts["at_end"] - counts["after_first_step"] < STEPS, counts


@pytest.mark.timeout(200)
def test_collective_workers_start_from_worker_0s_weights_and_only_worker_0_checkpoints(collective_run):
    assert "holds worker 0's variables" in collective_run.log("worker1")
    results = {i: json.loads((collective_run.out / f"worker{i}.json").read_text()) for i in (0, 1)}
    assert results[0]["checkpoint"] and results[1]["checkpoint"] is None
    assert results[0]["local_steps"] == results[1]["local_steps"] == STEPS


@pytest.mark.timeout(200)
def test_a_collective_checkpoint_restores_into_a_plain_single_process_model(collective_run):
    from tfcluster.training.evaluation import evaluate
    metrics = evaluate(job.make_model_fn(collective_run.data), job.make_eval_input_fn(collective_run.data),
                       str(collective_run.ckpt))
    x, y = collective_run.data["x"], collective_run.data["y"]
    assert metrics["global_step"] == STEPS
    assert metrics["loss"] == pytest.approx(job.mean_loss(collective_run.checkpoint(), x, y), rel=1e-4)


@pytest.mark.timeout(200)
def test_collective_composes_with_towers_inside_each_worker(collective_towers_run):
    run = collective_towers_run
    want = job.reference_weights(run.data, steps=STEPS, batch=2 * 2 * BATCH)  # 2 workers x 2 towers
    assert_weights(run.checkpoint(), want, "worker 0's checkpoint")
    w0, w1 = run.dump(0), run.dump(1)
    assert all(w0[k].tobytes() == w1[k].tobytes() for k in w0)
    assert "4 replica(s) in sync" in run.log("worker0")


@pytest.mark.timeout(120)
def test_a_worker_whose_peer_never_starts_gives_up_within_the_startup_timeout_naming_it(tmp_path, procs):
    run = Run(tmp_path, procs, strategy="collective", startup_timeout_secs=5)
    started = time.monotonic()
    run.start(workers=[0]).wait(100, expect=3)
    log = run.log("worker0")
    missing = f"worker:1 at {run.cluster['worker'][1]} does not answer"
    assert "job: error: worker:0: the all-reduce group failed during the start" in log and missing in log, log
    assert "Collective has timed out waiting for other workers" in log
    assert "Traceback" not in log
    assert time.monotonic() - started < 90  # TF's start-up, then the 5 s wait, not the 300 s default


# ======================================================= ps with towers
@pytest.mark.timeout(200)
def test_sync_parameter_servers_with_two_towers_per_worker_match_one_device_on_the_global_batch(tmp_path, procs):
    run = Run(tmp_path, procs, ps=1, strategy="sync", devices=2).start().wait(150)
    want = job.reference_weights(run.data, steps=STEPS, batch=2 * 2 * BATCH)  # 2 workers x 2 towers
    assert_weights(run.checkpoint(), want, "the chief's checkpoint")
    assert "2 tower(s) on /device:CPU:0, /device:CPU:1 (virtual CPU devices) per worker" in run.log("worker0")
    assert "4 replica(s) in sync" in run.log("worker0")


# ============================================================ the example
@pytest.mark.timeout(200)
def test_the_digits_example_trains_with_collective_all_reduce_under_tfcluster_local_with_no_ps(tmp_path, procs):
    example = os.path.join(os.path.dirname(HERE), "examples", "digits.py")
    p = procs.cli("local", "--ps", "0", "--workers", "2", "--log-dir", str(tmp_path / "logs"), "--timeout", "170",
                  "--", sys.executable, example, "--mode", "collective", "--steps", "150",
                  "--checkpoint-dir", str(tmp_path / "ckpt"), cwd=str(tmp_path))
    out, _ = p.communicate(timeout=190)
    assert p.returncode == 0, out[-4000:]
    assert "ps:" not in out  # no ps task was started
    assert "[worker:0] worker:0: 150 steps" in out and "[worker:1] worker:1: 150 steps" in out
    assert "all 2 workers hold identical variables" in out
    accuracy = float(out.split("test accuracy ")[1].split()[0])
    assert accuracy > 0.8, out[-3000:]
