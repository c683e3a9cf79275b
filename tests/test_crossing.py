"""A step's tensors between two tasks travel packed, lookups read the next batch's rows during this step, and
sparse updates take the lookup's distinct ids as they are: graph/crossing.py, graph/prefetch.py, graph/sparse.py.

A real ps and a real worker server run in this process (gRPC on free ports); each test builds its own graph
on them, and the same model in a plain process graph (TF's own lookup and reads) is the reference. Transfers are
read from traced steps (graph/traffic.py), as the bench and the cluster tests read them.
"""

import os
import re

import numpy as np
import pytest

from tfcluster.topology.ports import REUSE_ENV, PortReservation

WORKER, PS = "/job:worker/task:0/device:CPU:0", "/job:ps/task:0/device:CPU:0"
BATCHES = np.array([[[1, 7], [3, 7]], [[2, 5], [5, 5]], [[7, 1], [0, 4]], [[6, 6], [3, 2]]], np.int64)  # 4 x [2, 2]


@pytest.fixture(scope="module")
def target():
    """The worker's gRPC target of a 1 ps + 1 worker cluster served in this process."""
    import tensorflow as tf
    os.environ.update(REUSE_ENV)     # the servers bind the ports this process holds until they have
    with PortReservation(2) as held:
        spec = tf.train.ClusterSpec({"ps": [f"localhost:{held.ports[0]}"],
                                     "worker": [f"localhost:{held.ports[1]}"]})
        servers = [tf.compat.v1.train.Server(spec, job_name=job, task_index=0) for job in ("ps", "worker")]
    yield servers[1].target


def _model(name, on_cluster, lr=0.1, twice=False, wire="float32"):
    """A graph: 2-part table, 2 dense weights, Adagrad; ids from a dataset of :data:`BATCHES` (in order).
    ``twice``: the table looked up a second time with other ids; ``wire``: what the weights, rows and gradients
    travel in (graph/wire.py). Returns (graph, tensors)."""
    import tensorflow as tf

    from tfcluster.graph import sparse
    from tfcluster.graph.wire import Wire
    tf1 = tf.compat.v1
    sparse.install()
    graph = tf.Graph()
    with graph.as_default(), tf1.variable_scope(name):
        with tf1.device(WORKER if on_cluster else None):
            ds = tf.data.Dataset.from_tensor_slices((BATCHES, np.arange(4, dtype=np.float32))).repeat()
            iterator = tf1.data.make_initializable_iterator(ds)
            ids, number = iterator.get_next()
        reads = tf1.variable_creator_scope(Wire(wire, WORKER).creator()) if on_cluster else tf1.device(None)
        with tf1.device(PS if on_cluster else None), reads:
            table = tf1.get_variable("table", [9, 3], partitioner=tf1.fixed_size_partitioner(2),
                                     initializer=tf1.random_uniform_initializer(seed=1))
            w = tf1.get_variable("w", [6, 1], initializer=tf1.random_uniform_initializer(seed=2))
            b = tf1.get_variable("b", [1], initializer=tf1.ones_initializer())
        with tf1.device(WORKER if on_cluster else None):
            rows = tf.nn.embedding_lookup(table, ids)                       # [2, 2, 3]
            if twice:
                rows = rows + tf.nn.embedding_lookup(table, (ids + 1) % 9)
            logits = tf.matmul(tf.reshape(rows, [2, 6]), w) + b
            loss = tf.reduce_sum(tf.square(logits - number))
            seen = tf.identity(number, name="seen")         # the batch a step trained on
            gs = tf1.train.get_or_create_global_step()
            optimizer = tf1.train.AdagradOptimizer(lr)
            train = optimizer.minimize(loss, global_step=gs)
    parts = list(table)
    return graph, dict(iterator=iterator, number=number, seen=seen, rows=rows, loss=loss, train=train, gs=gs, parts=parts,
                       w=w, slots=[optimizer.get_slot(p, "accumulator") for p in parts])


def _reference(steps, **model):
    """What the model does in one process: ``(losses, final table, final w)``."""
    import tensorflow as tf
    graph, t = _model("ref", on_cluster=False, **model)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        losses = [s.run([t["loss"], t["train"]])[0] for _ in range(steps)]
        return losses, np.concatenate(s.run(t["parts"])), s.run(t["w"])


def _traced(session, fetches):
    import tensorflow as tf

    from tfcluster.graph.traffic import step_traffic
    meta = tf.compat.v1.RunMetadata()
    out = session.run(fetches, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                      run_metadata=meta)
    return out, step_traffic(meta)


def test_a_step_s_tensors_to_and_from_the_ps_travel_in_one_tensor_per_kind_and_train_as_in_one_process(target):
    import tensorflow as tf

    from tfcluster.graph import crossing
    steps = 4
    losses, table, w = _reference(steps)
    graph, t = _model("packed", on_cluster=True)
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        assert crossing.pending(graph) == 0                     # packed before the session first sent the graph
        got, transfers = [], []
        for _ in range(steps):
            (loss, _), traffic = _traced(s, [t["loss"], t["train"]])
            got.append(loss)
            transfers += traffic.transfers
        got_table, got_w = np.concatenate(s.run(t["parts"])), s.run(t["w"])
    np.testing.assert_allclose(got, losses, rtol=1e-6)
    np.testing.assert_allclose(got_table, table, rtol=1e-6)
    np.testing.assert_allclose(got_w, w, rtol=1e-6)
    # Over every traced step: a step's trace now and then lacks a RecvTensor record (1 run in 8 on main).
    sent = {x.tensor for x in transfers if x.nbytes and x.dst == "ps:0"}
    came = {x.tensor for x in transfers if x.nbytes and x.src == "ps:0"}
    # To the ps: the two parts' ids in one tensor, and every gradient (both parts' rows, w, b) in one; back: the
    # parts' rows in one and the weights in one. TF's control edges carry no bytes.
    assert len(sent) == 2 and all(name.endswith("/sent") for name in sent), sent
    assert len(came) == 2 and all(name.endswith("/sent") for name in came), came


def test_a_weight_read_alone_does_not_run_the_input_and_an_unread_crossing_rides_no_pack(target):
    import tensorflow as tf
    graph, t = _model("alone", on_cluster=True)
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        (_, traffic) = _traced(s, t["w"].value())          # the weights' pack: no ids, no rows, no batch read
        assert s.run(t["number"]) == 0.0                       # the input had not moved
    names = [x.tensor for x in traffic.transfers if x.nbytes]
    assert len(names) == 1, names
    assert not any("table" in x.tensor for x in traffic.transfers)      # the table's whole read never travels


def test_a_table_looked_up_twice_in_a_step_still_sums_its_duplicate_ids_next_to_it(target):
    import tensorflow as tf
    losses, table, _ = _reference(3, twice=True)
    graph, t = _model("twice", on_cluster=True, twice=True)
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        got = [s.run([t["loss"], t["train"]])[0] for _ in range(3)]
        got_table = np.concatenate(s.run(t["parts"]))
    np.testing.assert_allclose(got, losses, rtol=1e-6)
    np.testing.assert_allclose(got_table, table, rtol=1e-6)


def test_one_lookup_s_update_runs_no_second_deduplication_on_the_ps(target):
    import tensorflow as tf
    graph, t = _model("once", on_cluster=True)
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        _, traffic = _traced(s, t["train"])
    ps_ops = traffic.ops_on("ps:0")
    assert traffic.updates_on("ps:0") == 2, ps_ops
    assert "Unique" not in ps_ops and "UnsortedSegmentSum" not in ps_ops, ps_ops


def test_a_pack_splits_by_the_row_counts_each_side_knows_and_reads_no_shape_on_the_ps(target):
    # Rows and their gradients split by the ids each side sent or read times the rows' width, ids by the counts
    # they carry in front, vectors need no reshape: no shape read, product or cast of one in a step's packs.
    import tensorflow as tf

    from tfcluster.graph.traffic import task_of
    graph, t = _model("counted", on_cluster=True)
    meta = tf.compat.v1.RunMetadata()
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        s.run(t["train"], options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
              run_metadata=meta)
    ran = [(task_of(dev.device), node.node_name, re.match(r"\S+ = (\w+)", node.timeline_label).group(1))
           for dev in meta.step_stats.dev_stats for node in dev.node_stats
           if re.match(r"\S+ = (\w+)", node.timeline_label)]
    packs = [(task, name, kind) for task, name, kind in ran if "tfcluster_pack" in name]
    assert {task for task, _, _ in packs} == {"ps:0", "worker:0"}, packs
    assert not [p for p in packs if p[2] in ("Shape", "Prod", "Cast")], packs
    assert not [r for r in ran if r[0] == "ps:0" and r[2] in ("Shape", "VariableShape")], ran
    # Only matrices are flattened and shaped again, once on each side each way: 2 parts' rows and w, 2 x 2 x 3;
    # the ids and b are vectors.
    reshapes = [p for p in packs if p[2] == "Reshape"]
    assert len(reshapes) == 12, reshapes


def test_a_step_under_a_bfloat16_wire_casts_each_pack_once_on_each_side_and_trains_as_in_one_process(target):
    # Not once a piece: a 52-table step cast each table's rows and gradients on its ps (docs/embeddings.md).
    import tensorflow as tf

    from tfcluster.graph.traffic import task_of
    steps = 4
    losses, table, w = _reference(steps)
    graph, t = _model("narrow", on_cluster=True, wire="bfloat16")
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        got = [s.run([t["loss"], t["train"]])[0] for _ in range(steps - 1)]
        meta = tf.compat.v1.RunMetadata()
        got.append(s.run([t["loss"], t["train"]], run_metadata=meta,
                         options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE))[0])
        got_table, got_w = np.concatenate(s.run(t["parts"])), s.run(t["w"])
    wired = {op.name for op in graph.get_operations()
             if op.type == "Cast" and tf.bfloat16 in (op.get_attr("SrcT"), op.get_attr("DstT"))}
    casts = sorted((task_of(dev.device), node.node_name) for dev in meta.step_stats.dev_stats
                   for node in dev.node_stats if node.node_name in wired)
    # From the ps: the rows of both parts in one pack, the weights in another; to it: every gradient in one
    # (the ids are int64 and travel as they are). Each is cast where it leaves and where it arrives.
    assert [task for task, _ in casts] == ["ps:0"] * 3 + ["worker:0"] * 3, casts
    assert all(re.match(r"tfcluster_pack_\d+/(sent|received)$", name) for _, name in casts), casts
    # bfloat16 keeps 8 bits of mantissa: the rows and weights a step reads, and its gradients, round to them.
    np.testing.assert_allclose(got, losses, rtol=0.02)
    np.testing.assert_allclose(got_table, table, atol=0.02)
    np.testing.assert_allclose(got_w, w, atol=0.02)


def _staged(name, lr=0.1):
    """The cluster model with its lookups staged one step ahead; ``(graph, tensors, staging)``."""
    import tensorflow as tf

    from tfcluster.graph import prefetch
    tf1 = tf.compat.v1
    graph, t = _model(name, on_cluster=True, lr=lr)
    with graph.as_default():
        staging = prefetch.stage(graph, name)
        with tf1.device(WORKER):
            with tf.control_dependencies([t["train"]] + staging.attach(t["train"])):
                t["step"] = tf.identity(t["seen"])
            t["prime"] = staging.prime()
    return graph, t, staging


def test_a_staged_step_trains_on_its_batches_in_order_while_the_next_batch_s_rows_come_from_the_ps(target):
    import tensorflow as tf
    losses, table, _ = _reference(4, lr=0.0)        # a table that does not move: rows read early are the same
    graph, t, staging = _staged("staged", lr=0.0)
    assert staging.staged >= 4                       # the batch's label and ids, its rows, the ps's ids
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([tf.compat.v1.global_variables_initializer(), t["iterator"].initializer])
        s.run(t["prime"])
        seen = [s.run([t["step"], t["loss"]]) for _ in range(4)]
    assert [number for number, _ in seen] == [0.0, 1.0, 2.0, 3.0], seen
    # lr 0: the same losses as one process, although each batch's rows were read during the step before it.
    np.testing.assert_allclose([loss for _, loss in seen], losses, rtol=1e-6)


def test_a_staged_step_trains_the_staged_batch_s_own_ids_and_a_new_session_primes_afresh(target):
    import tensorflow as tf
    _, table, _ = _reference(3)
    graph, t, _ = _staged("restart")
    with graph.as_default():
        init = tf.compat.v1.global_variables_initializer()
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([init, t["iterator"].initializer])
        s.run(t["prime"])
        s.run(t["step"])
    # A session after a lost one: its areas hold a stale batch; priming empties them and stages its own first.
    with graph.as_default(), tf.compat.v1.Session(target, graph=graph) as s:
        s.run([init, t["iterator"].initializer])
        s.run(t["prime"])
        numbers = [s.run(t["step"]) for _ in range(3)]
        got_table = np.concatenate(s.run(t["parts"]))
    assert numbers == [0.0, 1.0, 2.0]
    # Updates went to the rows of each trained batch's own ids: untouched rows never moved, and each row
    # moved about as in one process (each batch's rows were read up to a step early).
    touched = np.zeros(9, bool)
    touched[BATCHES[:3].ravel()] = True
    initial = _initial_table()
    assert np.array_equal(got_table[~touched], initial[~touched])
    assert np.all(np.abs(got_table[touched] - initial[touched]).max(axis=1) > 0)
    np.testing.assert_allclose(got_table, table, atol=0.05)


def _initial_table():
    import tensorflow as tf
    graph, t = _model("initial", on_cluster=False)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as s:
        s.run(tf.compat.v1.global_variables_initializer())
        return np.concatenate(s.run(t["parts"]))


def test_a_lookup_of_fed_ids_is_not_staged_and_says_why(target, caplog):
    import tensorflow as tf

    from tfcluster.graph import prefetch, sparse
    tf1 = tf.compat.v1
    sparse.install()
    graph = tf.Graph()
    with graph.as_default():
        with tf1.device(PS):
            table = tf1.get_variable("fed/table", [9, 3])
        with tf1.device(WORKER):
            ids = tf1.placeholder(tf.int64, [None])
            tf.nn.embedding_lookup(table, ids)
        with caplog.at_level("INFO", logger="tfcluster"):
            assert prefetch.stage(graph, "fed") is None
    assert "its lookups' ids depend on the fed value" in caplog.text


def test_a_session_doing_bfloat16_math_sends_its_staged_rows_in_16_bits_and_their_gradients_in_32(target):
    # Unstaged, the rows a model multiplies cross in bfloat16 by themselves under bfloat16 math: grappler's
    # rewrite casts them where they are made, on the ps. Staged, a StagingArea of fixed types reads them on the
    # worker, so the session narrows them itself (docs/embeddings.md, "The next step's rows").
    import tensorflow as tf

    from tfcluster.graph import precision
    from tfcluster.graph.step import RunArgs, StepRunner, TrainGraph
    from tfcluster.graph.traffic import task_of
    from tfcluster.training.session import TrainingSession
    losses, _, _ = _reference(4, lr=0.0)
    for math in ("float32", "bfloat16"):
        graph, t, staging = _staged("session_" + math, lr=0.0)
        with graph.as_default():
            train_graph = TrainGraph(StepRunner(t["step"], t["loss"]), t["gs"], t["loss"],
                                     local_init_ops=[t["iterator"].initializer], staging=staging)
            config = precision.configure(tf.compat.v1.ConfigProto(), math, target=target)
            with TrainingSession(train_graph, target=target, config=config, name="session_" + math) as session:
                session.finalize()
                session.create()
                got = [session.step() for _ in range(3)]
                got.append(session.step(RunArgs([], options=tf.compat.v1.RunOptions(
                    trace_level=tf.compat.v1.RunOptions.FULL_TRACE))))
        assert [r.global_step for r in got] == [0, 1, 2, 3]          # the batch each step trained on
        ours = {op.name for op in graph.get_operations()
                if op.type == "Cast" and tf.bfloat16 in (op.get_attr("SrcT"), op.get_attr("DstT"))}
        casts = sorted((task_of(dev.device), node.node_name) for dev in got[-1].run_metadata.step_stats.dev_stats
                       for node in dev.node_stats if node.node_name in ours)
        if math == "float32":
            assert casts == []
            np.testing.assert_allclose([r.loss for r in got], losses, rtol=1e-6)
        else:
            # The rows of both parts leave the ps in one bfloat16 pack; the ids (int64) and the gradients going
            # back (their pack was made with the gradients, before staging) keep their types.
            assert [task for task, _ in casts] == ["ps:0", "worker:0"], casts
            assert all(re.match(r"tfcluster_pack_\d+/(sent|received)$", name) for _, name in casts), casts
            # The loss itself is bfloat16 math here (8 bits of mantissa, and a difference squared).
            np.testing.assert_allclose([r.loss for r in got], losses, rtol=0.05)
