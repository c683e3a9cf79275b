"""TF 2.21's false duplicate, made to happen for real, is run again once and costs nothing (issue 67).

TF 2.21's workers reject a RunGraph request whose id they saw among their last
100,000, and its ids repeat about once in 43,000 steps (core/duplicates.py,
docs/pitfalls.md item 15). A relay in front of a task's real server
(tests/duplicate_relay.py) makes that repeat on demand: it sends one request
upstream with the id of the one before it, and the server rejects it as it
rejects a collision. The master that ran the step reports it in either form TF
has: an AbortedError, or a CancelledError of the step's part that waited on
the rejected one, with the abort after it (the form that killed the README
example's worker).

Most tests here run a ps and a worker in this process, each behind a relay, and
a third task's master runs the steps on them, so either part can be the one
rejected. The reference is the same run without a collision: the rerun must
train exactly what it would have (graph/gate.py). The last test runs the README
example's shape in real processes with a repeat every few hundred requests.
"""

import contextlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, base_env, wait_until
from duplicate_relay import RepeatingRelay, request_id
from held_ports import REUSE
from tfcluster.topology.ports import REUSE_ENV, PortReservation

WORKER, PS = "/job:worker/task:0/device:CPU:0", "/job:ps/task:0/device:CPU:0"
#: Four batches of (x, y) read in order from a dataset on the worker, over and over.
X = np.arange(24, dtype=np.float32).reshape(4, 2, 3) / 10.0
Y = np.array([[[1.0], [2.0]], [[0.5], [1.5]], [[3.0], [0.0]], [[1.0], [1.0]]], np.float32)
IDS = np.array([[[1, 7], [3, 7]], [[2, 5], [5, 5]], [[7, 1], [0, 4]], [[6, 6], [3, 2]]], np.int64)
STEPS, COLLIDE_AT = 8, 5
#: The processes' run: the README example's async steps, and how often the relay repeats an id (every N-th RunGraph).
README_STEPS, EVERY = 4000, 500
RERUN = "running it again (attempt 2 of 5)"


class Cluster:
    """A ps and a worker, each served in this process behind a :class:`RepeatingRelay`, and a ``client`` task
    whose master (:attr:`target`) runs every step on them."""

    def __init__(self):
        import tensorflow as tf
        os.environ.update(REUSE_ENV)     # the servers bind the ports this process holds until they have
        with PortReservation(3) as held:
            ps, worker, client = held.ports
            self.relays = {"ps": RepeatingRelay(f"localhost:{ps}"), "worker": RepeatingRelay(f"localhost:{worker}")}
            spec = tf.train.ClusterSpec({"ps": [self.relays["ps"].address], "worker": [self.relays["worker"].address],
                                         "client": [f"localhost:{client}"]}).as_cluster_def()
            self.servers = [tf.compat.v1.train.Server(tf.train.ServerDef(cluster=spec, job_name=job, task_index=0,
                                                                         protocol="grpc", port=port))
                            for job, port in (("ps", ps), ("worker", worker), ("client", client))]
        self.target = self.servers[2].target

    def close(self):
        for relay in self.relays.values():
            relay.close()


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    yield c
    c.close()


def _dense(name, packed):
    """A linear model whose weights live on the ps: read through tfcluster's crossings (one pack a step) or as TF
    reads them (a transfer each). ``(graph, tensors)``."""
    import tensorflow as tf

    from tfcluster.graph.step import global_step_after
    from tfcluster.graph.wire import Wire
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), tf1.variable_scope(name):
        with tf1.device(WORKER):
            iterator = tf1.data.make_initializable_iterator(tf.data.Dataset.from_tensor_slices((X, Y)).repeat())
            x, y = iterator.get_next()
        reads = tf1.variable_creator_scope(Wire("float32", WORKER).creator()) if packed else contextlib.nullcontext()
        with tf1.device(PS), reads:
            w = tf1.get_variable("w", [3, 1], initializer=tf1.random_uniform_initializer(seed=3))
            b = tf1.get_variable("b", [1], initializer=tf1.zeros_initializer())
            gs = tf1.train.get_or_create_global_step()
        with tf1.device(WORKER):
            loss = tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y))
            train = tf1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=gs)
            fetch = global_step_after([train], gs)
    return graph, dict(iterator=iterator, loss=loss, fetch=fetch, gs=gs, state=[w, b])


def _staged(name):
    """A table of 2 parts on the ps looked up by ids from the worker's dataset, each step's rows fetched during
    the step before (graph/prefetch.py); Adagrad at rate 0, so the table stays put (rows read a step early are
    the same) while its accumulators count every gradient applied. ``(graph, tensors, staging)``."""
    import tensorflow as tf

    from tfcluster.graph import prefetch, sparse
    from tfcluster.graph.step import global_step_after
    tf1 = tf.compat.v1
    sparse.install()
    graph = tf.Graph()
    with graph.as_default(), tf1.variable_scope(name):
        with tf1.device(WORKER):
            ds = tf.data.Dataset.from_tensor_slices((IDS, np.arange(4, dtype=np.float32))).repeat()
            iterator = tf1.data.make_initializable_iterator(ds)
            ids, number = iterator.get_next()
        with tf1.device(PS):
            table = tf1.get_variable("table", [9, 3], partitioner=tf1.fixed_size_partitioner(2),
                                     initializer=tf1.random_uniform_initializer(seed=1))
            w = tf1.get_variable("w", [6, 1], initializer=tf1.random_uniform_initializer(seed=2))
            gs = tf1.train.get_or_create_global_step()
        with tf1.device(WORKER):
            rows = tf.nn.embedding_lookup(table, ids)
            loss = tf.reduce_sum(tf.square(tf.matmul(tf.reshape(rows, [2, 6]), w) - number))
            seen = tf.identity(number)
            optimizer = tf1.train.AdagradOptimizer(0.0)
            train = optimizer.minimize(loss, global_step=gs)
        staging = prefetch.stage(graph, name)
        with tf1.device(WORKER):
            fetch = global_step_after([train] + staging.attach(train), gs)
    slots = [optimizer.get_slot(v, "accumulator") for v in list(table) + [w]]
    return graph, dict(iterator=iterator, loss=seen, fetch=fetch, gs=gs, state=slots), staging


def _steps(session, cluster, collide=None) -> list:
    """STEPS steps of ``session``, the relay in front of ``collide`` (ps or worker, or None) repeating a request id
    in step COLLIDE_AT: each step's (global step, loss)."""
    steps = []
    for step in range(STEPS):
        if collide and step == COLLIDE_AT:
            cluster.relays[collide].repeat_next()
        r = session.step()
        steps.append((r.global_step, r.loss))
    return steps


def _train(cluster, model, collide=None):
    """Run ``model`` (a builder's result) for STEPS steps through a TrainingSession, the relay in front of
    ``collide`` (ps or worker) repeating a request id in step COLLIDE_AT. ``(each step's (global step, loss),
    the state variables' final values, ids the relays repeated)``."""
    import tensorflow as tf

    from tfcluster.graph.step import StepRunner, TrainGraph
    from tfcluster.training.session import TrainingSession
    graph, t, staging = model if len(model) == 3 else (*model, None)
    repeated = sum(r.repeated for r in cluster.relays.values())
    with graph.as_default():
        train_graph = TrainGraph(StepRunner(t["fetch"], t["loss"]), t["gs"], t["loss"],
                                 local_init_ops=[t["iterator"].initializer], staging=staging)
        with TrainingSession(train_graph, target=cluster.target, config=tf.compat.v1.ConfigProto(),
                             name="worker:0") as session:
            session.finalize()
            session.create()
            steps = _steps(session, cluster, collide)
            state = session.session.run(t["state"])
    return steps, state, sum(r.repeated for r in cluster.relays.values()) - repeated


# ------------------------------------------------------------------ the forms
#: What TF 2.21 reported when it killed the README example's worker (issue 67): the worker's cancelled receive
#: first, the ps's rejection after it, as a CancelledError.
ISSUE_67 = """Graph execution error:

=====================
CANCELLED: From /job:worker/replica:0/task:0:
RecvFromRemoteAsync is cancelled.
	 [[{{node tfcluster_pack_0/sent_S69}}]]
ABORTED: From /job:ps/replica:0/task:0:
The same RunGraph (Worker) request was received twice. goo.gle/debugstr  graph_handle: "0000000000000002"
====================="""


def test_a_repeated_request_id_is_rejected_in_the_forms_tf_reports_and_only_they_are_false_duplicates(
        cluster, reliability):
    import tensorflow as tf

    from tfcluster.core.duplicates import DUPLICATE_MARK, is_false_duplicate, reruns_its_own
    forms = {}
    for packed in (True, False):
        graph, t = _dense(f"forms_{packed}", packed)
        # On the worker's own master, as a trainer runs its steps: the worker's part is in-process.
        with graph.as_default(), tf.compat.v1.Session(cluster.servers[1].target) as s, reruns_its_own():
            s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
            for _ in range(6):
                cluster.relays["ps"].repeat_next()
                with pytest.raises(tf.errors.OpError) as rejected:
                    s.run(t["fetch"])
                error = rejected.value
                # Which form comes is TF's race between cancelling the worker's waiting receive and aborting its
                # rendezvous; either carries the ps's words.
                assert isinstance(error, (tf.errors.AbortedError, tf.errors.CancelledError)), error
                assert is_false_duplicate(error) and DUPLICATE_MARK in str(error)
                forms[type(error).__name__] = forms.get(type(error).__name__, 0) + 1
            assert s.run(t["gs"]) == 0          # no rejected run changed anything
    reliability("a repeated request id on the worker's own master, 12 runs: the forms TF reported",
                ", ".join(f"{n} {name}" for name, n in sorted(forms.items())))
    assert is_false_duplicate(tf.errors.CancelledError(None, None, ISSUE_67))
    # Only the rejection's words make one: a cancelled receive, or a lost session, is no false duplicate.
    assert not is_false_duplicate(tf.errors.CancelledError(None, None, ISSUE_67.split("ABORTED")[0]))
    assert not is_false_duplicate(tf.errors.AbortedError(None, None, "Session handle is not found"))
    assert not is_false_duplicate(RuntimeError(DUPLICATE_MARK))


def test_the_relay_repeats_the_request_id_it_is_asked_to_and_changes_no_other_byte():
    message = bytes([0x0A, 0x03]) + b"abc" + bytes([0x10, 0x07, 0x58]) + bytes([0x96, 0x01])   # ..., field 11 = 150
    assert request_id(message) == 150
    replaced = request_id(message, -5)              # an int64's negative id: ten bytes, two's complement
    assert request_id(replaced) == 2 ** 64 - 5 and replaced[:8] == message[:8]
    assert request_id(message[:-3]) is None


# --------------------------------------------------- steps, rerun exactly once
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("rejecting", ["ps", "worker"])
def test_a_step_one_task_falsely_rejects_is_rerun_once_and_trains_as_if_it_had_not_been(cluster, caplog, packed,
                                                                                       rejecting):
    from tfcluster.core import duplicates
    from tfcluster.graph import crossing
    name = f"{'packed' if packed else 'plain'}_{rejecting}"
    steps, state, _ = _train(cluster, _dense(name + "_ref", packed))
    met = duplicates.met()
    graph, t = _dense(name, packed)
    got, got_state, repeated = _train(cluster, (graph, t), collide=rejecting)
    assert repeated == 1 and duplicates.met() - met == 1 and caplog.text.count(RERUN) == 1, caplog.text
    assert bool(crossing.crossings(graph)) == packed
    # The rerun read the batch the rejected step had been given: every loss and weight as without it.
    np.testing.assert_allclose([loss for _, loss in got], [loss for _, loss in steps], rtol=1e-6)
    assert [gs for gs, _ in got] == list(range(1, STEPS + 1))
    for a, b in zip(got_state, state):
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("rejecting", ["ps", "worker"])
def test_a_staged_step_falsely_rejected_keeps_both_tasks_staging_areas_in_step(cluster, caplog, rejecting):
    # Before the gate the ps's and the worker's areas fell out of step: the rerun failed in the pack's split.
    _, reference, _ = _train(cluster, _staged(f"staged_{rejecting}_ref"))
    got, state, repeated = _train(cluster, _staged(f"staged_{rejecting}"), collide=rejecting)
    assert repeated == 1 and caplog.text.count(RERUN) == 1, caplog.text
    assert [number for _, number in got] == [0.0, 1.0, 2.0, 3.0] * 2        # the batches, each once, in order
    for a, b in zip(state, reference):          # Adagrad's accumulators: every gradient applied once
        np.testing.assert_allclose(a, b, rtol=1e-6)


@pytest.mark.parametrize("rejecting", ["ps", "worker"])
def test_a_sync_chief_step_falsely_rejected_is_applied_once(cluster, caplog, rejecting):
    import tensorflow as tf

    from tfcluster.strategies.sync import SyncGraph
    from tfcluster.strategies.sync_run import SyncRunner
    from tfcluster.graph.step import TrainGraph
    from tfcluster.training.session import TrainingSession

    def train(name, collide=None):
        tf1 = tf.compat.v1
        graph, t = _dense(name, packed=True)
        with graph.as_default():
            opt = tf1.train.GradientDescentOptimizer(0.05)
            w, b = t["state"]
            with tf1.device(WORKER):
                grads = opt.compute_gradients(t["loss"], [w, b])
                sync = SyncGraph(["worker:0"], 0, 1, t["gs"], grads, lambda g: opt.apply_gradients(g, t["gs"]),
                                 WORKER, loss=t["loss"])
                runner = SyncRunner(sync)
            train_graph = TrainGraph(runner, t["gs"], t["loss"], local_init_ops=[t["iterator"].initializer,
                                                                                  sync.local_step_init],
                                     chief_local_init_ops=sync.chief_init_ops(), state_variables=sync.state_variables)
            with TrainingSession(train_graph, target=cluster.target, config=tf1.ConfigProto(), name=name) as s:
                s.finalize()
                s.create()
                return _steps(s, cluster, collide), s.session.run([w, b])
    reference, state = train(f"sync_{rejecting}_ref")
    got, got_state = train(f"sync_{rejecting}", collide=rejecting)
    assert caplog.text.count("TF rejected sync step 5 as a duplicate request") == 1, caplog.text
    assert got == reference
    for a, b in zip(got_state, state):
        np.testing.assert_allclose(a, b, rtol=1e-6)


# ------------------------------------------------------------- TF1 mode
TF1_PROGRAM = r'''
import json, os, sys
import numpy as np
import tensorflow as tf          # TF1 mode: tf.compat.v1
from duplicate_relay import RepeatingRelay
from tfcluster.topology.ports import PortReservation

with PortReservation(2) as held:
    ps_port, worker_port = held.ports
    relay = RepeatingRelay("localhost:%d" % ps_port)
    spec = tf.train.ClusterSpec({"ps": [relay.address], "worker": ["localhost:%d" % worker_port]})
    ps = tf.train.Server(tf.train.ServerDef(cluster=spec.as_cluster_def(), job_name="ps", task_index=0,
                                            protocol="grpc", port=ps_port))
    server = tf.train.Server(spec, job_name="worker", task_index=0)
X = np.arange(24, dtype=np.float32).reshape(4, 2, 3) / 10.0
Y = np.array([[[1.0], [2.0]], [[0.5], [1.5]], [[3.0], [0.0]], [[1.0], [1.0]]], np.float32)


class Collide(tf.train.SessionRunHook):
    def after_run(self, run_context, run_values):
        if run_values.results == 4:
            relay.repeat_next()

    def before_run(self, run_context):
        return tf.train.SessionRunArgs(tf.train.get_global_step())


def train(collide):
    with tf.Graph().as_default():       # TF 1.x's between-graph shape: variables by replica_device_setter
        with tf.device(tf.train.replica_device_setter(cluster=spec, worker_device="/job:worker/task:0")):
            x, y = tf.data.Dataset.from_tensor_slices((X, Y)).repeat().make_one_shot_iterator().get_next()
            w = tf.get_variable("w", [3, 1], initializer=tf.random_uniform_initializer(seed=3))
            loss = tf.reduce_sum(tf.square(tf.matmul(x, w) - y))
            step = tf.train.GradientDescentOptimizer(0.05).minimize(loss, tf.train.get_or_create_global_step())
        hooks = [tf.train.StopAtStepHook(last_step=8)] + ([Collide()] if collide else [])
        losses = []
        with tf.train.MonitoredTrainingSession(master=server.target, is_chief=True, hooks=hooks,
                                               save_checkpoint_secs=None, save_summaries_steps=None) as sess:
            while not sess.should_stop():
                losses.append(float(sess.run([loss, step])[0]))
        return losses, relay.repeated

print("RESULT " + json.dumps({"reference": train(False), "collided": train(True)}))
relay.close()
'''


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_tf1_mode_reruns_a_monitored_sessions_falsely_rejected_step_and_the_program_trains_as_without_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TF1_PROGRAM)
    env = base_env(**REUSE, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "tests"), REPO]))
    r = subprocess.run([sys.executable, "-m", "tfcluster.tf1", str(script)], env=env, capture_output=True, text=True, timeout=140)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.split("RESULT ", 1)[1])
    (reference, none), (collided, repeated) = result["reference"], result["collided"]
    assert none == 0 and repeated == 1
    assert collided == pytest.approx(reference, rel=1e-6) and len(collided) == 8
    assert r.stderr.count(RERUN) == 1, r.stderr[-3000:]
    assert "train.py: TF falsely rejected 1 run(s) as duplicate requests" in r.stderr, r.stderr[-3000:]


# ------------------------------------------------- the README example, in processes
def _rerun_counts(text: str) -> int:
    return sum(int(n) for n in re.findall(r"TF falsely rejected (\d+) run\(s\) as duplicate requests", text))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_readme_example_async_on_a_ps_and_two_workers_trains_through_repeated_request_ids_to_exit_0(
        procs, tmp_path, reliability):
    ps_port, *worker_ports = procs.ports(3)
    relay = procs.start([sys.executable, os.path.join(REPO, "tests", "duplicate_relay.py"), "--upstream",
                         f"localhost:{ps_port}", "--every", str(EVERY), "--port-file", tmp_path / "relay.port",
                         "--count-file", tmp_path / "relay.count"])
    wait_until(lambda: (tmp_path / "relay.port").exists(), 60, "the relay to listen")
    workers = [f"localhost:{p}" for p in worker_ports]
    # The ps serves its own port; the workers reach it through the relay.
    (tmp_path / "ps.json").write_text(json.dumps({"ps": [f"localhost:{ps_port}"], "worker": workers}))
    (tmp_path / "workers.json").write_text(json.dumps({"ps": [f"localhost:{(tmp_path / 'relay.port').read_text()}"],
                                                       "worker": workers}))
    ps = procs.cli("start", "--cluster", tmp_path / "ps.json", "--job", "ps", "--task", "0", env=base_env(**REUSE))
    trainers = [procs.cli("start", "--cluster", tmp_path / "workers.json", "--job", "worker", "--task", str(i), "--",
                          sys.executable, os.path.join(REPO, "examples", "digits.py"), "--mode", "async", "--model",
                          "mlp", "--steps", str(README_STEPS), "--checkpoint-dir", tmp_path / "ckpt",
                          env=base_env(**REUSE), cwd=str(tmp_path)) for i in range(2)]
    logs = [p.communicate(timeout=240)[0] for p in trainers]
    assert [p.returncode for p in trainers] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert ps.wait(timeout=30) == 0
    relay.terminate()
    relay.wait(timeout=30)
    repeated, run_graphs = (int(n) for n in (tmp_path / "relay.count").read_text().split())
    reran = _rerun_counts("".join(logs))
    reliability(f"README example async, {README_STEPS:,} global steps on 1 ps + 2 workers, every {EVERY}th RunGraph "
                "request at the ps repeating an id: ids repeated / runs rerun (RunGraph requests)",
                f"{repeated} / {reran} ({run_graphs:,})")
    assert repeated >= 5 and reran == repeated, "\n".join(log[-3000:] for log in logs)
    assert all("Traceback" not in log for log in logs)
