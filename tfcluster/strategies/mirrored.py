"""Towers in one process, no cluster: MirroredStrategy and CentralStorageStrategy (the README's table of strategies).

- :class:`MirroredStrategy`: the first tower's device holds the variables and
  the optimizer state; every other tower holds a copy of the trainable
  variables. After each update the new values are copied to every tower in
  the same step, so all copies are identical by construction, not just to
  float tolerance.
- :class:`CentralStorageStrategy`: the variables live on the host CPU, and the
  towers compute on their devices. Each trainable variable is read once per
  step (``caching_device`` on the host) and sent to every tower.

The tower machinery itself, shared by every strategy, is :mod:`.towers`.
"""

from ..core.errors import SpecError
from ..graph.step import StepRunner, TrainGraph, global_step_after
from .base import Strategy
from .towers import Towers


class _OneProcessTowers(Strategy):
    """Towers in one process, no cluster: the base of mirrored and central storage.

    ``towers``: as for every strategy; None here means every GPU, or one CPU tower without GPUs.
    """

    def __init__(self, towers=None):
        super().__init__()
        self.towers = Towers(towers, storage=self.tower_storage)

    def bind(self, cluster) -> "Strategy":
        """Train alone; a cluster of more than one trainer (or with ps tasks) is refused."""
        if cluster is not None and (cluster.num_replicas > 1 or cluster.num_tasks("ps")):
            raise SpecError(
                f"the {self.name} strategy trains in one process; on a cluster use 'collective' "
                "(towers inside each worker, all-reduce between them) or 'sync'/'async' parameter servers "
                "with towers (strategies.get('sync', towers=n))")
        self.cluster = None
        self.towers.local_devices  # resolve (and check) the devices now, not in the middle of a graph
        return self

    @property
    def num_replicas_in_sync(self) -> int:
        """One replica per tower."""
        return self.towers.count

    def scope(self):
        """Global step, optimizer state of shared variables: the host CPU."""
        import tensorflow as tf
        return tf.compat.v1.device(self.towers.host(self))

    def input_scope(self):
        """The input pipeline runs on the host CPU and feeds every tower."""
        import tensorflow as tf
        return tf.compat.v1.device(self.towers.host(self))

    def placement_devices(self) -> list:
        """Every tower's device, so that a tower holding no variable still shows in the report."""
        return self.towers.placed(self)

    def build(self, model_fn, next_batch, optimizer, per_replica_batch=None) -> TrainGraph:
        """Towers, summed gradients, one update (and, mirrored, the copies refreshed in the same step)."""
        import tensorflow as tf
        with self.scope():
            tb = self.towers.build(self, model_fn, next_batch, optimizer, per_replica_batch)
            with tf.control_dependencies(tb.losses):
                train = tb.optimizer.apply_gradients(tb.grads, global_step=tb.global_step)
            after = [train]
            if tb.mirrors:
                after.append(tb.refresh([train]))
            fetch = global_step_after(after + tb.update_ops, tb.global_step)
        return TrainGraph(StepRunner(fetch, tb.mean), tb.global_step, tb.mean, model=tb.model)


class MirroredStrategy(_OneProcessTowers):
    """One replica per local device in one graph; every tower holds a copy of the variables.

    The first tower's device holds the variables and the optimizer state; the
    towers' gradients are summed there, applied once, and the new values are
    copied to every other tower in the same step. ``towers``: see :class:`~.towers.Towers`.
    """

    name = "mirrored"
    tower_storage = "mirrored"

    def describe(self) -> str:
        """e.g. ``mirrored: 2 tower(s) on /device:CPU:0, /device:CPU:1 (virtual CPU devices), ...``."""
        return (f"{self.name}: {self.towers.describe()}; variables on {self.towers.local_devices[0]}, "
                "copied to every tower after each update")


class CentralStorageStrategy(_OneProcessTowers):
    """One replica per local device in one graph; the variables live on the CPU.

    Each trainable variable is read once per step on the CPU and sent to every
    tower; the towers' gradients are summed on the CPU and applied once.
    ``towers``: see :class:`~.towers.Towers`.
    """

    name = "central"

    def describe(self) -> str:
        """e.g. ``central: 2 tower(s) on /device:CPU:0, /device:CPU:1; variables on /device:CPU:0``."""
        return f"{self.name}: {self.towers.describe()}; variables on {self.towers.host(self)}"
