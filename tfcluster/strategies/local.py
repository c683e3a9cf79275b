"""One process, one replica, no cluster: the reference every other strategy must match."""

from ..graph.step import StepRunner, TrainGraph, global_step_after
from .base import Strategy, build_single_replica


class LocalStrategy(Strategy):
    """One process and no cluster: plain ``apply_gradients`` on the scaled loss (towers, if asked, share it)."""

    name = "local"
    trains_embedding_variables = True

    def bind(self, cluster) -> "Strategy":
        """A local strategy ignores any cluster: it always trains alone."""
        self.cluster = None
        return self

    @property
    def num_replicas_in_sync(self) -> int:
        """One replica per tower (one without towers)."""
        return self.replicas_per_worker

    def build(self, model_fn, next_batch, optimizer, per_replica_batch=None) -> TrainGraph:
        """Plain ``apply_gradients`` on the scaled loss."""
        with self.scope():
            gs, opt, out, mean, grads, update_ops = build_single_replica(self, model_fn, next_batch, optimizer,
                                                                         per_replica_batch)
            train = opt.apply_gradients(grads, global_step=gs)
        return TrainGraph(StepRunner(global_step_after([train] + update_ops, gs), mean), gs, mean, model=out)
