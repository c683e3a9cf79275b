"""One run assembly under every front end: a task's part, a trainer's hooks in one order, the strategy a TF 1.x
request becomes.

``fit``, the Estimator and tf-keras's ``fit`` all reach tfcluster/training/assembly.py; their clusters are
tested end to end in test_ps_training.py, test_canned.py and test_keras_cluster.py.
"""

import contextlib

import pytest

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

from tfcluster import Cluster, Role, TfclusterError, strategies  # noqa: E402
from tfcluster.graph.step import Hook, StepRunner, TrainGraph  # noqa: E402
from tfcluster.training.assembly import RunAssembly, part_of  # noqa: E402
from tfcluster.training.hooks import CheckpointHook, SummaryHook, TrainersDone  # noqa: E402
from tfcluster.training.liveness import ChiefHeartbeat  # noqa: E402


def cluster_with(job: str, index: int = 0) -> Cluster:
    spec = {"ps": ["localhost:2222"], "chief": ["localhost:2223"], "worker": ["localhost:2224"],
            "evaluator": ["localhost:2225"], "local": ["localhost:2226"]}
    return Cluster.from_dict(spec).with_task(job, index)


def test_alone_a_program_trains_and_a_trainer_or_the_evaluator_gets_its_role():
    assert part_of(None, "fit") is None
    assert part_of(cluster_with("chief"), "fit") is Role.CHIEF
    assert part_of(cluster_with("worker"), "fit") is Role.WORKER
    assert part_of(cluster_with("evaluator"), "fit") is Role.EVALUATOR


@pytest.mark.parametrize("front_end", ["fit", "train_and_evaluate", "tfcluster.keras.fit"])
def test_a_task_of_no_role_is_refused_in_one_line_naming_the_front_end_and_the_task(front_end):
    with pytest.raises(TfclusterError) as e:
        part_of(cluster_with("local"), front_end)
    line = str(e.value)
    assert "\n" not in line and line.startswith(front_end) and "local:0" in line


def test_fit_refuses_a_task_of_no_role_before_it_starts_a_server():
    from tfcluster import fit
    with pytest.raises(TfclusterError, match="local:0 is none of them"):
        fit(lambda f, l, m: None, lambda ctx: None, optimizer=None, steps=1, cluster=cluster_with("local"))


#: A ps and two workers: the shape in which a trainer needs every standard hook.
TWO_WORKERS = Cluster.from_dict({"ps": ["localhost:2222"], "worker": ["localhost:2223", "localhost:2224"]})


@contextlib.contextmanager
def a_trainers_graph():
    """A TrainGraph whose global step is on the ps, as every trainer's of TWO_WORKERS is."""
    with tf1.Graph().as_default():
        with tf1.device("/job:ps/task:0"):
            step = tf1.train.get_or_create_global_step()
        loss = tf.constant(0.0)
        yield TrainGraph(StepRunner(step, loss), step, loss)


class Mark(Hook):
    """A front end's own hook, known by its name."""

    def __init__(self, name):
        self.name = name


def test_a_chiefs_hooks_come_in_one_order_the_wait_for_the_trainers_first_the_heartbeat_before_the_last(tmp_path):
    run = RunAssembly(TWO_WORKERS.with_task("worker", 0), checkpoint_dir=str(tmp_path))
    with a_trainers_graph() as graph:
        session = run.session(graph, config=None, saver=tf1.train.Saver([graph.global_step]))
        summary = SummaryHook(None, tf.constant(""), 10)
        hooks = run.hooks(graph, session, saver=session.saver, save_steps=10, own=[Mark("own")], summary=summary,
                          chief=[Mark("chief")], after=[Mark("after")])
    kinds = [getattr(h, "name", None) if isinstance(h, Mark) else type(h) for h in hooks]
    assert kinds == [TrainersDone, "own", SummaryHook, CheckpointHook, "chief", ChiefHeartbeat, "after"]
    assert run.checkpoints is hooks[3] and run.should_init and run.saves


def test_a_workers_hooks_have_no_checkpoints_and_no_chiefs_hooks_and_it_initialises_only_when_told(tmp_path):
    worker = RunAssembly(TWO_WORKERS.with_task("worker", 1), checkpoint_dir=str(tmp_path))
    assert not worker.is_chief and not worker.should_init and not worker.saves
    assert RunAssembly(TWO_WORKERS.with_task("worker", 1), should_init=True).should_init    # an all-reduce's worker
    with a_trainers_graph() as graph:
        session = worker.session(graph, config=None)
        hooks = worker.hooks(graph, session, chief=[Mark("chief")], after=[Mark("after")])
    assert [type(h) for h in hooks] == [TrainersDone, ChiefHeartbeat, Mark]
    assert session.checkpoint_dir is None and worker.checkpoints is None


def test_a_tf1_request_for_all_reduce_becomes_the_registered_collective_strategy_on_several_trainers_only():
    two = Cluster.from_dict({"worker": ["localhost:1", "localhost:2"]}).with_task("worker", 1)
    two_and_ps = Cluster.from_dict({"worker": ["localhost:1", "localhost:2"], "ps": ["localhost:3"]}).with_task(
        "worker", 0)
    chosen = strategies.for_request("collective", two)
    assert isinstance(chosen, strategies.CollectiveAllReduceStrategy) and chosen.cluster is two
    assert (chosen.num_workers, chosen.worker_index, chosen.should_init) == (2, 1, True)
    # The Estimator's ps tasks idle beside all-reduce (they serve and exit); tf-keras's have no part to play.
    assert strategies.for_request("collective", two_and_ps, idle_ps=True).cluster is two_and_ps
    assert strategies.for_request("collective", two_and_ps) is None
    # One trainer, no cluster, or another request: one process's towers, or the ps as TF 1.x used them.
    one = Cluster.from_dict({"worker": ["localhost:1"]}).with_task("worker", 0)
    assert strategies.for_request("collective", one) is None and strategies.for_request("collective", None) is None
    assert strategies.for_request("ps", two_and_ps) is None and strategies.for_request("mirrored", two) is None
    assert strategies.for_request(None, two) is None
