"""Ways of replicating a model: one small interface (:class:`Strategy`), one file per way."""

from ..errors import SpecError
from .base import (Hook, InputContext, LocalStrategy, Mode, ModelFnError, ModelOutput, ReplicaContext,
                   StepResult, StepRunner, Strategy, TrainGraph, replica_loss)
from .parameter_server import ParameterServerStrategy, SyncStallError
from .mirrored import CentralStorageStrategy, MirroredStrategy, Towers
from .collective import CollectiveAllReduceStrategy, CollectiveError

__all__ = ["Strategy", "LocalStrategy", "ParameterServerStrategy", "SyncStallError", "Mode", "ModelOutput",
           "ModelFnError", "InputContext", "ReplicaContext", "TrainGraph", "StepRunner", "StepResult", "Hook",
           "replica_loss", "get", "MirroredStrategy", "CentralStorageStrategy", "Towers",
           "CollectiveAllReduceStrategy", "CollectiveError"]

_NAMES = {
    "local": LocalStrategy,
    "async": lambda: ParameterServerStrategy("async"),
    "ps-async": lambda: ParameterServerStrategy("async"),
    "sync": lambda: ParameterServerStrategy("sync"),
    "ps-sync": lambda: ParameterServerStrategy("sync"),
    "mirrored": MirroredStrategy,
    "central": CentralStorageStrategy,
    "central-storage": CentralStorageStrategy,
    "collective": CollectiveAllReduceStrategy,
    "multi-worker-mirrored": CollectiveAllReduceStrategy,
}


def get(strategy) -> Strategy:
    """A Strategy from an instance or a name: local, async, sync, mirrored, central or collective."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str) and strategy in _NAMES:
        return _NAMES[strategy]()
    raise SpecError(f"unknown strategy {strategy!r}; use one of {', '.join(sorted(_NAMES))} "
                    "or a tfcluster.strategies.Strategy")
