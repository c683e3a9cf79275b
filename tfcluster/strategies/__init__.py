"""Ways of replicating a model: one small interface (:class:`Strategy`), one file per way."""

from ..errors import SpecError
from .base import (Hook, InputContext, LocalStrategy, Mode, ModelFnError, ModelOutput, ReplicaContext,
                   StepResult, StepRunner, Strategy, TrainGraph, replica_loss)
from .parameter_server import ParameterServerStrategy, SyncStallError

__all__ = ["Strategy", "LocalStrategy", "ParameterServerStrategy", "SyncStallError", "Mode", "ModelOutput",
           "ModelFnError", "InputContext", "ReplicaContext", "TrainGraph", "StepRunner", "StepResult", "Hook",
           "replica_loss", "get"]

_NAMES = {
    "local": LocalStrategy,
    "async": lambda: ParameterServerStrategy("async"),
    "ps-async": lambda: ParameterServerStrategy("async"),
    "sync": lambda: ParameterServerStrategy("sync"),
    "ps-sync": lambda: ParameterServerStrategy("sync"),
}


def get(strategy) -> Strategy:
    """A Strategy from an instance or a name: ``local``, ``async`` (ps-async) or ``sync`` (ps-sync)."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str) and strategy in _NAMES:
        return _NAMES[strategy]()
    raise SpecError(f"unknown strategy {strategy!r}; use one of {', '.join(sorted(_NAMES))} "
                    "or a tfcluster.strategies.Strategy")
