"""Placement: the byte-balanced ps setter, the partitioner, and the placement report.

These build graphs against a Cluster description; no process or server is needed.
"""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

from tfcluster import Cluster  # noqa: E402
from tfcluster.graph.placement import (ByteBalancedSetter, PlacementReport, device_setter, is_table,  # noqa: E402
                                 partition_big_variables, partitioning_getter, placement_report)

PS0, PS1 = "/job:ps/task:0", "/job:ps/task:1"
MB = 1 << 20


def two_ps_cluster(task=("worker", 0)):
    return Cluster({"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3", "localhost:4"]}, task)


def build(setter, shapes, partitioner=None):
    """Build float32 variables of the given shapes under ``setter``; return the graph."""
    g = tf1.Graph()
    with g.as_default(), tf1.device(setter), tf1.variable_scope("m", partitioner=partitioner):
        for i, shape in enumerate(shapes):
            tf1.get_variable(f"v{i}", shape=shape, dtype=tf.float32, initializer=tf1.zeros_initializer())
    return g


BIG_THEN_SMALL = [(1024, 1024), (512, 1024)] + [(64, 160)] * 100  # 4 MB, 2 MB, 100 x 40 KB


def test_two_big_and_many_small_variables_end_within_ten_percent_of_even():
    setter = device_setter(two_ps_cluster())
    g = build(setter, BIG_THEN_SMALL)
    report = placement_report(g)
    totals = report.totals()
    assert set(totals) == {PS0, PS1}
    assert sum(totals.values()) == 6 * MB + 100 * 64 * 160 * 4
    assert report.imbalance() < 0.10, report.format(per_variable=False)
    # the two big ones are on different ps tasks
    big = {r.name: r.device for r in report.records if r.nbytes >= 2 * MB}
    assert len(set(big.values())) == 2


def test_round_robin_placement_of_the_same_variables_is_far_from_even():
    # The contrast that makes the test above mean something (pitfalls item 10).
    rr = tf1.train.replica_device_setter(ps_tasks=2, worker_device="/job:worker/task:0")
    report = placement_report(build(rr, BIG_THEN_SMALL))
    assert report.imbalance() > 0.10


def test_a_big_variable_created_last_is_split_across_ps_tasks_by_the_partitioner():
    shapes = [(64, 160)] * 50 + [(1024, 1024)]  # greedy alone would leave 4 MB on one side
    alone = placement_report(build(device_setter(two_ps_cluster()), shapes))
    assert alone.imbalance() > 0.5
    parted = placement_report(build(device_setter(two_ps_cluster()), shapes,
                                    partitioner=partition_big_variables(2, min_bytes=1 * MB)))
    assert parted.imbalance() < 0.10
    parts = sorted(r.name for r in parted.records if r.nbytes == 2 * MB)
    assert parts == ["m/v50/part_0", "m/v50/part_1"]
    assert {r.device for r in parted.records if r.name in parts} == {PS0, PS1}


def test_small_variables_are_not_partitioned():
    p = partition_big_variables(4, min_bytes=1 * MB)
    assert p(tf.TensorShape([100, 10]), tf.float32) == [1, 1]
    assert p(tf.TensorShape([1024, 1024]), tf.float32) == [4, 1]
    assert p(tf.TensorShape([2, 1 << 20]), tf.float32) == [2, 1]  # no more parts than rows


def test_a_variable_bigger_than_the_shard_size_is_cut_into_parts_no_bigger():
    p = partition_big_variables(1, min_bytes=0, max_shard_bytes=8 * MB)
    assert p(tf.TensorShape([4096, 1024]), tf.float32) == [2, 1]     # 16 MB -> two of 8 MB
    assert p(tf.TensorShape([5000, 1024]), tf.float32) == [3, 1]     # 19.5 MB -> three
    assert p(tf.TensorShape([784, 512]), tf.float32) == [1, 1]


def variables_in_ps_scope(make, cluster=None, **options):
    """Run ``make()`` inside a ParameterServerStrategy's scope (graph only); return its variables by name."""
    from tfcluster.strategies import ParameterServerStrategy
    strategy = ParameterServerStrategy("async", **options).bind(
        cluster or Cluster({"worker": ["localhost:1"], "ps": ["localhost:2"]}, ("worker", 0)))
    with tf1.Graph().as_default(), strategy.scope():
        make()
        return {v.op.name: v for v in tf1.global_variables()}


def test_ps_training_keeps_each_part_of_a_big_variable_at_most_8_mb():
    got = variables_in_ps_scope(lambda: (tf1.get_variable("emb", [5000, 1024]), tf1.get_variable("w", [784, 512])))
    assert sorted(got) == ["emb/part_0", "emb/part_1", "emb/part_2", "w"]
    assert all(v.device == PS0 for v in got.values())
    assert max(v.shape.num_elements() * 4 for v in got.values()) <= 8 * MB


def test_a_table_bigger_than_the_shard_size_is_one_part_per_ps_a_dense_kernel_still_8_mb_parts():
    # A lookup moves rows, not parts; each part costs every step a gather, a transfer and an update of its own.
    assert is_table([1_000_000, 16]) and is_table([2_600_000, 1]) and not is_table([5000, 1024])
    assert not is_table([16 << 20])          # a vector is pulled whole, however long
    p = partition_big_variables(1, min_bytes=0, max_shard_bytes=8 * MB, tables_across=2)
    assert p(tf.TensorShape([1_000_000, 16]), tf.float32) == [2, 1]         # 64 MB: two parts, not eight
    assert p(tf.TensorShape([100_000, 16]), tf.float32) == [1, 1]           # 6.4 MB: whole
    assert p(tf.TensorShape([5000, 1024]), tf.float32) == [3, 1]


def test_on_two_ps_a_table_is_a_part_on_each_and_its_optimizer_slots_follow_their_parts_unsplit():
    def make():
        table = tf1.get_variable("table", [1_000_000, 16])
        kernel = tf1.get_variable("kernel", [784, 512])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, [1, 999_999])) + tf.reduce_sum(kernel)
        tf1.train.AdagradOptimizer(0.1).minimize(loss)
    # partition_min_bytes splits the 1.6 MB kernel over both ps too; no slot is split again (TF's slot_creator
    # turns a scope's partitioner off for slots; a custom getter has to say so itself).
    got = variables_in_ps_scope(make, cluster=two_ps_cluster(("worker", 0)), partition_min_bytes=1 * MB)
    assert sorted(got) == ["kernel/part_0", "kernel/part_0/Adagrad", "kernel/part_1", "kernel/part_1/Adagrad",
                           "table/part_0", "table/part_0/Adagrad", "table/part_1", "table/part_1/Adagrad"]
    assert {got[f"table/part_{i}"].device for i in (0, 1)} == {PS0, PS1}
    assert all(got[f"{n}/Adagrad"].device == got[n].device for n in got if not n.endswith("Adagrad"))


def test_on_ps_on_two_machines_a_big_dense_kernel_is_split_over_both_and_a_small_one_stays_whole():
    # Every step moves a dense variable's bytes both ways: one 1.6 MB kernel on one ps would make its network
    # the busiest. On one machine the ps share its CPUs and loopback, and the parts' transfers only cost.
    def make():
        return tf1.get_variable("big", [784, 512]), tf1.get_variable("small", [128, 10])
    two_machines = Cluster({"worker": ["169.254.7.1:1"], "ps": ["169.254.7.2:2", "169.254.7.3:3"]}, ("worker", 0))
    got = variables_in_ps_scope(make, cluster=two_machines)
    assert sorted(got) == ["big/part_0", "big/part_1", "small"]
    assert {got["big/part_0"].device, got["big/part_1"].device} == {PS0, PS1}
    assert sorted(variables_in_ps_scope(make, cluster=two_machines, partition_min_bytes=0)) == ["big", "small"]
    assert sorted(variables_in_ps_scope(make, cluster=two_ps_cluster(("worker", 0)))) == ["big", "small"]
    assert sorted(variables_in_ps_scope(make, cluster=two_ps_cluster(("worker", 0)), partition_min_bytes=256 << 10)) \
        == ["big/part_0", "big/part_1", "small"]


@pytest.mark.parametrize("initializer", ["glorot_uniform_initializer", "truncated_normal_initializer"])
def test_a_split_dense_variable_starts_at_the_values_one_process_gives_it(initializer):
    def value(split):
        with tf1.Graph().as_default():
            tf1.set_random_seed(7)
            init = getattr(tf1, initializer)(seed=3)  # a seeded draw: TF would repeat it in every part
            scope = tf1.variable_scope("", custom_getter=partitioning_getter(partition_big_variables(3, min_bytes=1))) \
                if split else tf1.variable_scope("")
            with scope:
                v = tf1.get_variable("kernel", [300, 40], initializer=init)
            assert (type(v).__name__ == "PartitionedVariable") == split
            with tf1.Session() as sess:
                sess.run(tf1.global_variables_initializer())
                return sess.run(tf.concat(list(v), 0) if split else v)
    np.testing.assert_array_equal(value(split=True), value(split=False))


@pytest.mark.parametrize("how", ["numpy value", "constant_initializer of an array", "own partitioner",
                                 "max_shard_bytes=None"])
def test_a_big_variable_stays_whole_where_parts_cannot_be_made_or_were_not_asked_for(how):
    big = tf.zeros([4096, 1024]).shape

    def make():
        if how == "numpy value":
            import numpy as np
            tf1.get_variable("v", initializer=np.ones(big, np.float32))
        elif how == "constant_initializer of an array":
            import numpy as np
            tf1.get_variable("v", big, initializer=tf1.constant_initializer(np.ones(big, np.float32)))
        elif how == "own partitioner":
            with tf1.variable_scope("", partitioner=tf1.fixed_size_partitioner(4)):
                tf1.get_variable("v", big)
        else:
            tf1.get_variable("v", big)
    got = variables_in_ps_scope(make, **({"max_shard_bytes": None} if how == "max_shard_bytes=None" else {}))
    assert sorted(got) == (["v/part_%d" % i for i in range(4)] if how == "own partitioner" else ["v"])


def test_non_variable_ops_go_to_the_worker_device_and_explicit_pins_are_kept():
    setter = device_setter(two_ps_cluster(("worker", 1)))
    g = tf1.Graph()
    with g.as_default(), tf1.device(setter):
        a = tf1.get_variable("a", shape=[10], initializer=tf1.zeros_initializer())
        with tf1.device(PS1):
            pinned = tf1.get_variable("pinned", shape=[1000], initializer=tf1.zeros_initializer())
        y = tf.reduce_sum(a) * 2.0
        with tf1.device("/device:CPU:0"):
            z = y + 1.0
    assert a.device == PS0
    assert pinned.device == PS1
    assert y.device == "/job:worker/task:1"
    assert z.device == "/job:worker/task:1/device:CPU:0"
    # the pinned variable's bytes count toward its ps
    assert setter.loads == {PS0: 40, PS1: 4000}


def test_resource_and_ref_variables_are_both_balanced():
    setter = ByteBalancedSetter([PS0, PS1])
    g = tf1.Graph()
    with g.as_default(), tf1.device(setter):
        tf1.get_variable("r", shape=[1000], use_resource=True)
        tf1.get_variable("v", shape=[1000], use_resource=False)
    assert [d for _, d, _ in setter.assigned] == [PS0, PS1]
    assert {d: b for d, b in setter.loads.items()} == {PS0: 4000, PS1: 4000}


def test_a_cluster_without_ps_tasks_has_no_setter():
    assert device_setter(Cluster({"worker": ["localhost:1"]}, ("worker", 0))) is None
    assert device_setter(None) is None


def test_the_report_prints_each_ps_with_its_total_and_variables(capsys):
    g = build(device_setter(two_ps_cluster()), [(256, 256), (10,)])
    report = placement_report(g)
    report.print()
    out = capsys.readouterr().out
    assert "placement of 2 variable(s)" in out
    assert PS0 in out and PS1 in out
    assert "m/v0" in out and "256x256" in out and "256.0 KB" in out
    assert repr(report) == "PlacementReport(2 variables on 2 devices)"


def test_an_idle_ps_shows_in_the_report_and_counts_as_imbalance():
    g = build(ByteBalancedSetter([PS0]), [(10,)])
    report = placement_report(g, devices=[PS0, PS1])
    assert report.totals() == {PS0: 40, PS1: 0}
    assert report.imbalance() == pytest.approx(1.0)
    assert isinstance(report, PlacementReport)
