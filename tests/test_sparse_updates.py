"""A sparse update of ids tfcluster's lookup made distinct updates every row of the step at once and equals TF's.

TF's CPU kernels update a sparse gradient one row after another, waiting on
memory for each row of the variable and of each slot; where the ids are
distinct, the rows wide and the optimizer does not ask for locking,
tfcluster/graph/sparse_updates.py makes the same rule a gather, elementwise math
and a scatter. These tests hold it to TF's own kernels, row by row, for every
rule it makes (TF 1.x's Adagrad, Ftrl and Momentum on resource and reference
variables), and name where TF's kernel stays. The figures it was made for are
the bench's (docs/embeddings.md); the ps-trained tables of every TF 1.x sparse
optimizer are tests/test_embeddings.py's.
"""

import numpy as np
import pytest

from tfcluster.graph import sparse_updates

ROWS, WIDTH, TOUCHED = 300, 6, 40


@pytest.fixture
def at_once():
    """The patches of graph/sparse_updates.py in (tf-keras's too) for the test, then as they were."""
    from tfcluster.core import patches
    was = {name for name in _patch_names() if patches.installed(name)}
    sparse_updates.install(keras=True)
    yield
    for name in set(_patch_names()) - was:
        patches.uninstall(name)


def _tfs(make_update, **kwargs):
    """:func:`_apply` with TF's own deduplication and kernels (tfcluster's patches out for the call)."""
    from tfcluster.core import patches
    with patches.taken_out(*_patch_names()):
        return _apply(make_update, **kwargs)


def _apply(make_update, width=WIDTH, mark=True, ref=False, steps=3, seed=0):
    """``(table and slots after steps, op types the graph made)``: ``make_update(var, grad, ids)`` applied to
    ``TOUCHED`` distinct ids of a ``ROWS x width`` table, ``steps`` times with fresh gradients (the slots grow)."""
    import tensorflow as tf
    tf1 = tf.compat.v1
    rng = np.random.RandomState(seed)
    graph = tf.Graph()
    with graph.as_default():
        var = tf1.get_variable("table", [ROWS, width], initializer=tf1.random_uniform_initializer(-1, 1, seed=1),
                               use_resource=not ref)
        ids = tf1.placeholder(tf.int64, [None], name="ids")
        grad = tf1.placeholder(tf.float32, [None, width], name="grad")
        if mark:
            sparse_updates.mark_distinct(ids)
        update = make_update(var, grad, ids)
        init = tf1.global_variables_initializer()
        state = tf1.global_variables()
        types = {op.type for op in graph.get_operations()}
    with tf1.Session(graph=graph) as session:
        session.run(init)
        for _ in range(steps):
            chosen = rng.choice(ROWS, TOUCHED, replace=False)
            session.run(update, {ids: chosen, grad: rng.normal(size=(TOUCHED, width)).astype(np.float32)})
        return {v.op.name: value for v, value in zip(state, session.run(state))}, types


def _tf1(optimizer):
    """An update of the table by ``optimizer()`` (TF 1.x's or tf-keras's) from a sparse gradient."""
    import tensorflow as tf
    return lambda var, grad, ids: optimizer().apply_gradients([(tf.IndexedSlices(grad, ids), var)])


def _optimizers():
    import tensorflow as tf
    train = tf.compat.v1.train
    return {
        "adagrad": lambda: train.AdagradOptimizer(0.3),
        "ftrl": lambda: train.FtrlOptimizer(0.3, l1_regularization_strength=0.01, l2_regularization_strength=0.02),
        "ftrl_power": lambda: train.FtrlOptimizer(0.3, learning_rate_power=-0.7, l1_regularization_strength=0.01),
        "ftrl_shrinkage": lambda: train.FtrlOptimizer(0.3, l1_regularization_strength=0.01,
                                                      l2_shrinkage_regularization_strength=0.05, beta=0.1),
        "momentum": lambda: train.MomentumOptimizer(0.1, 0.9),
        "nesterov": lambda: train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    }


TF1_OPTIMIZERS = ["adagrad", "ftrl", "ftrl_power", "ftrl_shrinkage", "momentum", "nesterov"]


def _rule_ops(types):
    return sorted(t for t in types if t.startswith(("SparseApply", "ResourceSparseApply")))


def _assert_same(ours, tfs):
    assert ours.keys() == tfs.keys()
    for name in ours:
        np.testing.assert_allclose(ours[name], tfs[name], rtol=2e-6, atol=2e-7, err_msg=name)


@pytest.mark.parametrize("ref", [False, True], ids=["resource", "reference"])
@pytest.mark.parametrize("name", TF1_OPTIMIZERS)
def test_a_tf1_optimizers_update_of_distinct_ids_is_made_at_once_and_equals_tfs_kernel(name, ref, at_once):
    make = _tf1(_optimizers()[name])
    tfs, tf_types = _tfs(make, ref=ref)
    ours, our_types = _apply(make, ref=ref)
    _assert_same(ours, tfs)
    assert _rule_ops(tf_types) and not _rule_ops(our_types), (tf_types, our_types)
    assert {"ResourceScatterUpdate" if not ref else "ScatterUpdate"} <= our_types


@pytest.mark.parametrize("why, kwargs", [
    ("ids a program made may repeat: TF's kernel adds them up, a scatter would keep one", dict(mark=False)),
    ("a row of one number: TF's flat loop is faster than three ops", dict(width=1)),
])
def test_tfs_kernel_stays_where_ids_may_repeat_or_rows_are_one_number(why, kwargs, at_once):
    _, types = _apply(_tf1(_optimizers()["adagrad"]), **kwargs)
    assert _rule_ops(types) == ["ResourceSparseApplyAdagrad"], why


def test_tfs_kernel_stays_where_the_optimizer_asks_for_locking_as_tf_keras_optimizers_always_do(at_once):
    import tensorflow as tf
    import tf_keras        # the legacy extra (the README's install)
    _, types = _apply(_tf1(lambda: tf.compat.v1.train.AdagradOptimizer(0.3, use_locking=True)))
    assert _rule_ops(types) == ["ResourceSparseApplyAdagrad"]
    _, types = _apply(_tf1(lambda: tf_keras.optimizers.legacy.Adagrad(0.3)))
    assert _rule_ops(types) == ["ResourceSparseApplyAdagradV2"]


def test_every_rule_names_an_op_of_tensorflow_with_the_inputs_it_reads():
    from tensorflow.python.ops import gen_training_ops
    import inspect
    assert len(sparse_updates.RULES) == 8
    for rule in sparse_updates.RULES.values():
        parameters = list(inspect.signature(getattr(gen_training_ops, rule.function)).parameters)
        assert parameters[:len(rule.inputs)] == list(rule.inputs), rule.op
        assert rule.state[0] == "var" and set(rule.state) <= set(rule.inputs)


def _patch_names():
    return [f"sparse.at_once.{op}" for op in sparse_updates.RULES] + [
        "sparse.distinct_updates", "sparse.distinct_updates_ref", "sparse.distinct_updates_keras"]


def test_under_bfloat16_math_the_update_stays_float32(at_once):
    """oneDNN's mixed precision rewrites a model's matrix work to bfloat16; the rows an update reads, its math and
    what it writes stay float32, as TF's kernel's did (graph/precision.py)."""
    import tensorflow as tf
    from tfcluster.graph import precision
    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        table = tf1.get_variable("table", [ROWS, 16], use_resource=True)
        kernel = tf1.get_variable("kernel", [16, 64], use_resource=True)
        ids = tf1.placeholder(tf.int64, [None])
        sparse_updates.mark_distinct(ids)
        loss = tf.reduce_sum(tf.nn.relu(tf.matmul(tf.gather(table, ids), kernel)))
        optimizer = tf1.train.AdagradOptimizer(0.1)
        grads = [(tf.IndexedSlices(g.values, ids) if isinstance(g, tf.IndexedSlices) else g, v)
                 for g, v in optimizer.compute_gradients(loss)]
        train = optimizer.apply_gradients(grads)
        init = tf1.global_variables_initializer()
    with tf1.Session(graph=graph, config=precision.configure(tf1.ConfigProto(), "bfloat16")) as session:
        session.run(init)
        metadata = tf1.RunMetadata()
        session.run(train, {ids: np.arange(0, ROWS, 3)}, run_metadata=metadata,
                    options=tf1.RunOptions(output_partition_graphs=True))
    nodes = [n for g in metadata.partition_graphs for n in g.node]
    assert any("AutoMixedPrecision" in n.name for n in nodes), "the model's matrix work ran in bfloat16"
    update = [n for n in nodes if "update_table" in n.name and "T" in n.attr]
    assert {n.op for n in update} >= {"Rsqrt", "Mul", "AddV2"}
    assert {tf.as_dtype(n.attr["T"].type).name for n in update} == {"float32"}
