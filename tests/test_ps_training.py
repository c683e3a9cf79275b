"""Parameter-server training on real clusters of separate processes (1 ps + 2 workers).

Each cluster is started by hand, the multi-terminal way: the ps with
``tfcluster start``, every worker as ``python _fit_job.py`` with TF_CONFIG set,
so nothing here depends on a launcher. One sync and one async cluster are
shared by the tests of a module (each test reads a different fact off the same
run); recovery has a cluster of its own.
"""

import json
import os
import re
import sys
import time

import numpy as np
import pytest

from conftest import TFCLUSTER, Procs, base_env, data_files, kill_tree, need_root, wait_until
from held_ports import REUSE

tf = pytest.importorskip("tensorflow")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _fit_job as job  # noqa: E402

from tfcluster.training.evaluation import evaluate, predict  # noqa: E402

pytestmark = pytest.mark.slow
JOB = [sys.executable, os.path.join(HERE, "_fit_job.py")]
BATCH = 16


class Run:
    """A hand-started cluster: its files, processes and logs."""

    def __init__(self, tmp, procs, workers=2, ps=1, **cfg):
        self.tmp, self.procs = tmp, procs
        p = [f"localhost:{port}" for port in procs.ports(workers + ps)]
        self.cluster = {"worker": p[:workers], "ps": p[workers:]}
        self.cluster_file = tmp / "cluster.json"
        self.cluster_file.write_text(json.dumps(self.cluster))
        self.data = job.make_data(str(tmp / "data.npz"))
        self.ckpt = tmp / "ckpt"
        cfg.setdefault("batch", BATCH)
        self.cfg = dict(data=str(tmp / "data.npz"), checkpoint_dir=str(self.ckpt), out=str(tmp / "out"),
                        log_every_secs=0.5, **cfg)
        (tmp / "cfg.json").write_text(json.dumps(self.cfg))
        self.p = {}
        self.started_at = {}

    def log(self, name) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _start(self, name, cmd, env):
        self.started_at[name] = time.time()
        out = open(self.tmp / f"{name}.log", "w")
        self.p[name] = self.procs.start(cmd, env=env, stdout=out, stderr=out)
        out.close()
        return self.p[name]

    def ps(self, index=0, name="ps", wrap=()):
        """Start ps ``index``; ``wrap``: a command it runs under (a private mount namespace)."""
        return self._start(name, list(wrap) + TFCLUSTER + ["start", "--cluster", self.cluster_file, "--job", "ps",
                                                           "--task", str(index)], base_env(**REUSE))

    def task(self, name, job_name, index, cfg=None, **env):
        """Start a trainer or the evaluator; ``cfg`` overrides this run's job config for it."""
        # The evaluator gets the same cluster, which does not list it (pitfalls item 12).
        tf_config = {"cluster": self.cluster, "task": {"type": job_name, "index": index}}
        cfg_file = self.tmp / "cfg.json"
        if cfg:
            cfg_file = self.tmp / f"cfg_{name}.json"
            cfg_file.write_text(json.dumps(dict(self.cfg, **cfg)))
        return self._start(name, JOB + [cfg_file], base_env(TF_CONFIG=json.dumps(tf_config), **REUSE, **env))

    def wait_all(self, timeout, names=None):
        """Exit codes of the named processes; stops early when one fails (the others would only stall)."""
        names = list(names or self.p)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = {n: self.p[n].poll() for n in names}
            if all(c is not None for c in codes.values()) or any(c not in (None, 0) for c in codes.values()):
                return codes
            time.sleep(0.2)
        late = [n for n in names if self.p[n].poll() is None]
        raise AssertionError(f"{', '.join(late)} did not exit within {timeout}s; log of {late[0]}:\n"
                             f"{self.log(late[0])[-3000:]}")

    def tails(self, codes) -> str:
        """The log tails of the processes that did not exit 0, for an assertion message."""
        return "\n".join(f"--- {n} exited {c}:\n{self.log(n)[-2500:]}" for n, c in codes.items() if c != 0)

    def result(self, task):
        return json.loads((self.tmp / "out" / f"{task}.json").read_text())

    def weights(self, step=None):
        path = tf.train.latest_checkpoint(str(self.ckpt)) if step is None else str(self.ckpt / f"model.ckpt-{step}")
        r = tf.train.load_checkpoint(path)
        return {k: r.get_tensor(k) for k in job.NAMES}, path


def stamp(log_text, pattern):
    """The t=... wall-clock time on the first log line matching ``pattern`` (a debug line: run with debug=True)."""
    m = re.search(pattern + r".*?t=([0-9.]+)", log_text)
    assert m, f"no line matching {pattern!r} in:\n{log_text[-2000:]}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def cluster_procs():
    p = Procs()
    yield p
    p.cleanup()


# ====================================================================== sync
SYNC_STEPS = 30


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory, cluster_procs):
    """Sync, 2 workers x batch 16. The chief starts alone and must wait; worker 1 joins later."""
    run = Run(tmp_path_factory.mktemp("sync"), cluster_procs, mode="sync", steps=SYNC_STEPS, save_steps=10,
              stall_warn_secs=1.0, debug=True)
    run.ps()
    run.task("w0", "worker", 0)
    # The chief pushed its gradient for step 0 and reports that it waits for worker:1.
    wait_until(lambda: "not yet from worker:1" in run.log("w0"), 150, "the chief to wait for worker:1")
    run.task("w1", "worker", 1)
    run.codes = run.wait_all(150)
    return run


@pytest.mark.timeout(330)
def test_sync_workers_end_at_the_weights_of_one_process_training_on_the_global_batch(sync_run):
    assert sync_run.codes == {"ps": 0, "w0": 0, "w1": 0}, sync_run.tails(sync_run.codes)
    got, path = sync_run.weights()
    assert path.endswith(f"model.ckpt-{SYNC_STEPS}")
    want = job.reference_weights(sync_run.data, steps=SYNC_STEPS, batch=2 * BATCH)
    start = {k: sync_run.data[k.split("/")[1]] for k in job.NAMES}
    for k in job.NAMES:
        assert np.abs(want[k] - start[k]).max() > 0.05  # the weights really moved
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    for task in ("worker0", "worker1"):
        assert sync_run.result(task)["global_step"] == SYNC_STEPS
        assert sync_run.result(task)["local_steps"] == SYNC_STEPS  # one gradient per worker per step


def test_a_sync_step_is_not_filled_by_the_chief_alone(sync_run):
    w0 = sync_run.log("w0")
    # While alone, the chief reported step 0 half full, repeatedly, and did not move on.
    waits = re.findall(r"has waited \d+s on sync step (\d+): (\d) of 2 gradient", w0)
    assert len(waits) >= 2 and set(waits) == {("0", "1")}
    # Its first step completed only after worker 1 was started, and it was global step 1.
    first = stamp(w0, r"worker:0 first step done")
    assert first > sync_run.started_at["w1"]
    assert re.search(r"worker:0 first step done .* global step 1\b", w0)


def test_ps_tasks_exit_on_their_own_when_every_worker_is_done(sync_run):
    assert sync_run.codes["ps"] == 0
    ps = sync_run.log("ps")
    assert "worker:0 is done" in ps and "worker:1 is done" in ps and "every trainer is done" in ps


def test_a_cluster_checkpoint_predicts_the_same_in_a_single_process(sync_run):
    weights, path = sync_run.weights()
    x = sync_run.data["x"]
    preds = predict(job.make_model_fn(sync_run.data), lambda ctx: tf.data.Dataset.from_tensor_slices(x).batch(64),
                    path)
    np.testing.assert_allclose(preds["logits"], job.forward(weights, x), rtol=1e-4, atol=1e-5)
    # and those are the predictions of the reference training, not just of whatever was saved
    want = job.reference_weights(sync_run.data, steps=SYNC_STEPS, batch=2 * BATCH)
    np.testing.assert_allclose(preds["logits"], job.forward(want, x), rtol=1e-3, atol=1e-4)
    assert (preds["class"] == job.forward(want, x).argmax(1)).all()


def test_the_checkpoint_holds_the_model_and_nothing_of_the_cluster(sync_run):
    _, path = sync_run.weights()
    names = set(tf.train.load_checkpoint(path).get_variable_to_shape_map())
    assert names == set(job.NAMES) | {"global_step"}


# ===================================================================== async
ASYNC_STEPS = 200


@pytest.fixture(scope="module")
def async_run(tmp_path_factory, cluster_procs):
    """Async, 2 workers. Worker 1 starts first and waits for the model; then the chief and the evaluator."""
    run = Run(tmp_path_factory.mktemp("async"), cluster_procs, mode="async", steps=ASYNC_STEPS, save_steps=50,
              lr=0.2, debug=True)
    run.ps()
    run.task("w1", "worker", 1)
    wait_until(lambda: "waits for the chief" in run.log("w1"), 150, "worker 1 to wait for the chief")
    run.task("w0", "worker", 0)
    run.task("ev", "evaluator", 0)
    run.codes = run.wait_all(180)
    return run


@pytest.mark.timeout(330)
def test_a_non_chief_starts_within_seconds_of_the_chief_initialising_not_thirty(async_run):
    assert async_run.codes == {"ps": 0, "w1": 0, "w0": 0, "ev": 0}, async_run.tails(async_run.codes)
    w0, w1 = async_run.log("w0"), async_run.log("w1")
    init = stamp(w0, r"worker:0 initialised the model")
    ready = stamp(w1, r"worker:1 found the model ready")
    first0 = stamp(w0, r"worker:0 first step done")
    first1 = stamp(w1, r"worker:1 first step done")
    # The chief logs its line after the init op returned; a fast poll can see the
    # model ready a few milliseconds before that line is written.
    assert -0.5 < ready - init < 5.0, (init, ready)
    assert abs(first1 - first0) < 5.0, (first0, first1)


def test_async_training_lowers_the_loss(async_run):
    x, y = async_run.data["x"], async_run.data["y"]
    start = {k: async_run.data[k.split("/")[1]] for k in job.NAMES}
    final = evaluate(job.make_model_fn(async_run.data), job.make_eval_input_fn(async_run.data), str(async_run.ckpt))
    assert final["global_step"] >= ASYNC_STEPS
    assert final["loss"] < 0.6 * job.mean_loss(start, x, y)
    both = [async_run.result(t)["local_steps"] for t in ("worker0", "worker1")]
    assert min(both) > 0  # both workers trained
    # each worker stops once the global step reaches the target; the last racing updates may overshoot
    assert ASYNC_STEPS <= sum(both) <= ASYNC_STEPS + 2


def test_the_final_checkpoint_holds_every_update_and_the_evaluator_reports_it(async_run):
    assert async_run.codes["ev"] == 0
    ev = async_run.log("ev")
    # The chief's final save waits for the other worker's last step, which may land after the chief's own.
    total = sum(async_run.result(t)["local_steps"] for t in ("worker0", "worker1"))
    assert re.search(rf"evaluator: model\.ckpt-{total} \(global step {total}\): loss=[0-9.]+ accuracy=[0-9.]+", ev), \
        ev[-2000:]
    assert "training is done" in ev
    assert async_run.codes["ps"] == 0


# ============================================================ partitioning
@pytest.mark.timeout(300)
def test_variables_split_over_two_ps_train_like_one_process_and_restore_whole(tmp_path, procs):
    """One sync worker, two ps, the big variables partitioned across them."""
    run = Run(tmp_path, procs, workers=1, ps=2, mode="sync", steps=20, batch=32, partition_min_bytes=100,
              log_placement=True)
    run.ps(0, "ps0")
    run.ps(1, "ps1")
    run.task("w0", "worker", 0)
    codes = run.wait_all(150)
    assert codes == {"ps0": 0, "ps1": 0, "w0": 0}, run.tails(codes)
    log = run.log("w0")
    # Each ps wrote its own part of every checkpoint (TF 1.x's sharded saves); one process reads them whole below.
    assert f"checkpoints: each of 2 ps saves its own variables into {run.ckpt} (sharded)" in log
    assert data_files(run.ckpt) == ["model.ckpt-20.data-00000-of-00002", "model.ckpt-20.data-00001-of-00002"]
    # dense/w1 (640 B) and out/w2 (192 B) are split, one part on each ps
    for var in ("dense/w1", "out/w2"):
        assert re.search(rf"/job:ps/task:0 .*\n(?:      .*\n)*      {var}/part_[01] ", log), log[-3000:]
        assert re.search(rf"/job:ps/task:1 .*\n(?:      .*\n)*      {var}/part_[01] ", log), log[-3000:]
    got, path = run.weights()
    assert set(tf.train.load_checkpoint(path).get_variable_to_shape_map()) == set(job.NAMES) | {"global_step"}
    want = job.reference_weights(run.data, steps=20, batch=32)
    for k in job.NAMES:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    x = run.data["x"]
    preds = predict(job.make_model_fn(run.data), lambda ctx: tf.data.Dataset.from_tensor_slices(x).batch(64), path)
    np.testing.assert_allclose(preds["logits"], job.forward(want, x), rtol=1e-4, atol=1e-5)


@pytest.mark.timeout(300)
def test_a_ps_that_writes_another_disk_makes_the_chief_save_whole_and_a_sharded_run_restores_that(tmp_path, procs):
    """ps:1 sees an empty disk of its own at the checkpoint path, as on a machine without the shared filesystem."""
    # CI sets CI=1: the check read CI == "true" and this test skipped there without a word.
    need_root("it mounts a tmpfs in a private mount namespace")
    run = Run(tmp_path, procs, workers=1, ps=2, mode="async", steps=20, batch=32, partition_min_bytes=100)
    run.ckpt.mkdir()
    run.ps(0, "ps0")
    run.ps(1, "ps1", wrap=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount -t tmpfs tfcluster-other-disk "$0" && exec "$@"', str(run.ckpt)])
    run.task("w0", "worker", 0)
    codes = run.wait_all(150)
    assert codes == {"ps0": 0, "ps1": 0, "w0": 0}, run.tails(codes)
    assert (f"checkpoints: ps:1 cannot write {run.ckpt} (its file is not where this task reads (another machine's "
            f"disk, no shared filesystem)); the chief writes whole checkpoints instead") in run.log("w0")
    assert data_files(run.ckpt) == ["model.ckpt-20.data-00000-of-00001"]
    assert not [f for f in os.listdir(run.ckpt) if f.startswith(".tfcluster-ps-writes")]     # ps:0's probe removed
    # A run whose ps share the dir restores that whole checkpoint into its sharded Saver, and saves sharded.
    (tmp_path / "again").mkdir()
    again = Run(tmp_path / "again", procs, workers=1, ps=2, mode="async", steps=40, batch=32, partition_min_bytes=100)
    again.ps(0, "ps0")
    again.ps(1, "ps1")
    again.task("w0", "worker", 0, cfg={"checkpoint_dir": str(run.ckpt)})
    codes = again.wait_all(150)
    assert codes == {"ps0": 0, "ps1": 0, "w0": 0}, again.tails(codes)
    result = json.loads((tmp_path / "again" / "out" / "worker0.json").read_text())
    assert (result["global_step"], result["local_steps"]) == (40, 20)
    assert data_files(run.ckpt) == ["model.ckpt-40.data-00000-of-00002", "model.ckpt-40.data-00001-of-00002"]
    want = job.reference_weights(run.data, steps=40, batch=32)
    got, _ = run.weights()
    for k in job.NAMES:     # one worker's async steps are one process's, across the restart
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)


# =================================================================== stalls
@pytest.mark.serial     # the stall's seconds are read from its message
@pytest.mark.timeout(300)
def test_backups_never_wait_and_a_missing_worker_without_backup_stalls_then_gives_up(tmp_path, procs):
    run = Run(tmp_path, procs, mode="sync", steps=20, stall_warn_secs=1.0)
    run.ps()
    # 1 of 2 workers per step: worker 1 is a backup, and it never comes.
    run.task("backup", "worker", 0, cfg={"replicas_to_aggregate": 1, "checkpoint_dir": str(tmp_path / "a")})
    assert run.wait_all(150, names=["backup"]) == {"backup": 0}, run.tails({"backup": 1})
    assert "has waited" not in run.log("backup")
    assert re.search(r"ps-sync: 1 of 2 workers per step", run.log("backup"))
    # A new run on the same live ps needs both workers: it must stall, say who is missing, and give up.
    # (Its chief joins the model the ps still holds, at step 20, and is asked to go on to 40.)
    run.task("alone", "worker", 0, cfg={"stall_timeout_secs": 4.0, "checkpoint_dir": str(tmp_path / "b"),
                                        "steps": 40})
    assert run.wait_all(150, names=["alone"]) == {"alone": 1}
    alone = run.log("alone")
    assert "joined the model the ps tasks hold" in alone
    assert "has waited 1s on sync step 20: 1 of 2 gradient(s) in (worker:0); not yet from worker:1 (none yet)" in alone
    assert re.search(r"SyncStallError: sync step stalled for [4-9]s \(stall_timeout_secs=4\): "
                     r"1 of 2 gradient\(s\) in \(worker:0\); not yet from worker:1", alone), alone[-2000:]


# ================================================================== recovery
@pytest.mark.timeout(420)
def test_killed_workers_restarted_by_hand_let_the_sync_run_finish(tmp_path, procs):
    """kill -9 worker 1, then the chief; each is restarted by hand and the run reaches its target."""
    steps = 200
    run = Run(tmp_path, procs, mode="sync", steps=steps, save_steps=20, stall_warn_secs=1.0, step_sleep=0.05)
    run.ps()
    # This cluster runs with TF1 behaviour (ref variables, v1 control flow), as legacy scripts do.
    run.task("w0", "worker", 0, FIT_JOB_V1="1")
    run.task("w1", "worker", 1, FIT_JOB_V1="1")

    def global_step(name):
        seen = re.findall(r"\(global (\d+)\)", run.log(name))
        return int(seen[-1]) if seen else -1

    wait_until(lambda: global_step("w1") >= 10, 200, "worker 1 to reach global step 10")
    kill_tree(run.p["w1"].pid)
    # Without worker 1 (and no backup), the chief stalls and says who is missing.
    wait_until(lambda: re.search(r"not yet from worker:1 \(last step", run.log("w0")), 60,
               "the chief to report that worker:1 is missing")
    run.task("w1b", "worker", 1, FIT_JOB_V1="1")

    wait_until(lambda: global_step("w0") >= 50, 200, "the chief to reach global step 50")
    kill_tree(run.p["w0"].pid)
    wait_until(lambda: re.search(r"worker:1 has waited \d+s on sync step \d+", run.log("w1b")), 60,
               "worker 1 to report that it waits")
    run.task("w0b", "worker", 0, FIT_JOB_V1="1")

    codes = run.wait_all(240, names=["w0b", "w1b", "ps"])
    assert codes == {"w0b": 0, "w1b": 0, "ps": 0}, run.tails(codes)
    # The restarted chief joined the model the ps still held, and went on from there: nobody rolled back
    # to the last checkpoint (TF 1.x's chief restored it over the live ps).
    assert "worker:0 joined the model the ps tasks hold" in run.log("w0b")
    first = int(re.search(r"worker:0 first step done .* global step (\d+)", run.log("w0b")).group(1))
    assert first > 50
    assert "restored the model" not in run.log("w0b")
    assert run.result("worker0")["global_step"] == steps
    assert run.result("worker1")["global_step"] == steps
    assert "every trainer is done" in run.log("ps")


@pytest.mark.timeout(60)
def test_a_sessions_local_init_sets_the_sync_step_to_the_global_step_every_time():
    """A restarted chief joins at the live global step; its local init must never leave its sync step at 0.

    The local init runs the local variables' initialisers and the step's assignment in one run; TF orders
    neither before the other unless the graph says so (one run in ~50 zeroed it, and a chief restarted by
    hand waited for gradients of step 0 for ever).
    """
    from types import SimpleNamespace

    from tfcluster.strategies.sync import SyncGraph
    from tfcluster.training.session import scaffold_ops
    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        gs = tf1.train.get_or_create_global_step()
        w = tf1.get_variable("w", [2], initializer=tf1.zeros_initializer())
        graph = SyncGraph(["worker:0", "worker:1"], 0, 2, gs, [(tf.ones([2]), w)],
                          lambda aggregated: tf1.assign_add(gs, 1), "")
        train_graph = SimpleNamespace(local_init_ops=[graph.local_step_init],
                                      chief_local_init_ops=graph.chief_init_ops(),
                                      state_variables=graph.state_variables)
        local_init = scaffold_ops(train_graph, is_chief=True)[3]
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(gs.assign(50))
            steps = []
            for _ in range(2000):
                session.run(local_init)
                steps.append(int(session.run(graph.local_step)))
    assert set(steps) == {50}, {s: steps.count(s) for s in set(steps)}
