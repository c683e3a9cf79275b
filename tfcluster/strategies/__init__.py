"""Ways of replicating a model: one small interface (:class:`Strategy`), one file per way, one registry.

``get("sync", backups=1, towers=2)`` makes a strategy from its registered
name and its options; ``fit``, the CLI's ``--strategy`` and the examples all
go through it. A new strategy is a file with a :class:`Strategy` subclass and
one :func:`register` line below.

- :mod:`.base`: the Strategy interface, and the one-replica build most strategies share;
- :mod:`.towers`: several replicas (towers) inside one worker, for every strategy;
- :mod:`.keras_towers`: a tf-keras model as towers, each batch split over the devices;
- :mod:`.local`: one process, no cluster: the reference the others are tested against;
- :mod:`.mirrored`: in-graph towers, mirrored or with variables on the CPU (central storage);
- :mod:`.parameter_server`: between-graph replication over ps tasks, async or sync;
- :mod:`.sync`: the synchronous step's graph: one gradient per distinct worker;
- :mod:`.sync_run`: running it, every wait bounded and named;
- :mod:`.sync_replicas`: TF 1.x's ``SyncReplicasOptimizer`` API on that same step;
- :mod:`.collective`: between-graph all-reduce with no ps (MultiWorkerMirroredStrategy).
- :mod:`.recorded`: a model that makes its own update (an Estimator's ``model_fn``) on towers or all-reduce.
"""

import functools
import inspect
import os

from ..core import environment
from ..core.errors import CollectiveError, ModelFnError, SpecError, SyncStallError
from ..graph.model import InputContext, Mode, ModelOutput, ReplicaContext, replica_loss
from ..graph.step import Hook, StepResult, StepRunner, TrainGraph
from .base import Strategy
from .collective import CollectiveAllReduceStrategy
from .local import LocalStrategy
from .mirrored import CentralStorageStrategy, MirroredStrategy
from .parameter_server import ParameterServerStrategy
from .towers import Towers

__all__ = ["Strategy", "LocalStrategy", "ParameterServerStrategy", "MirroredStrategy", "CentralStorageStrategy",
           "CollectiveAllReduceStrategy", "Towers", "TrainGraph", "StepRunner", "StepResult", "Hook",
           "SyncStallError", "CollectiveError", "get", "register", "names", "canonical", "default_name", "for_request",
           "STRATEGY_ENV",
           # the model contract (tfcluster.graph.model), here too for model functions written against it
           "Mode", "ModelOutput", "ModelFnError", "InputContext", "ReplicaContext", "replica_loss"]

#: Environment variable naming the strategy ``fit`` uses when its caller names none (``--strategy``).
STRATEGY_ENV = environment.STRATEGY.name

_REGISTRY = {}      # name -> factory(**options) -> Strategy
_ALIASES = {}       # alias -> name


def register(name: str, factory, aliases=()):
    """Make ``get(name, **options)`` call ``factory(**options)``; ``aliases`` are other names for it."""
    _REGISTRY[name] = factory
    for alias in aliases:
        _ALIASES[alias] = name


register("local", LocalStrategy)
register("async", functools.partial(ParameterServerStrategy, "async"), aliases=["ps-async"])
register("sync", functools.partial(ParameterServerStrategy, "sync"), aliases=["ps-sync"])
register("mirrored", MirroredStrategy)
register("central", CentralStorageStrategy, aliases=["central-storage"])
register("collective", CollectiveAllReduceStrategy, aliases=["multi-worker-mirrored"])


def canonical(name: str) -> str:
    """The registered name ``name`` stands for (``sync`` for ``ps-sync``); any other name as it is."""
    return _ALIASES.get(name, name)


def names() -> list:
    """Every registered name (aliases included), sorted."""
    return sorted(set(_REGISTRY) | set(_ALIASES))


def _options_of(factory) -> list:
    return [p.name for p in inspect.signature(factory).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def get(strategy, **options) -> Strategy:
    """A Strategy from an instance, or from a registered name and its options."""
    if isinstance(strategy, Strategy):
        if options:
            raise SpecError(f"options {', '.join(sorted(options))} go with a strategy name, not an instance")
        return strategy
    name = _ALIASES.get(strategy, strategy) if isinstance(strategy, str) else None
    if name not in _REGISTRY:
        raise SpecError(f"unknown strategy {strategy!r}; use one of {', '.join(names())} "
                        "or a tfcluster.strategies.Strategy", params=["strategy"])
    factory = _REGISTRY[name]
    known = _options_of(factory)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise SpecError(f"strategy {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                        f"{', '.join(known)}")
    return factory(**options)


def default_name(cluster) -> str:
    """The strategy for a cluster when none is named: ``TFCLUSTER_STRATEGY``, else by the cluster's shape.

    Without a cluster (or one trainer and no ps): local. With ps tasks: async.
    Several trainers and no ps: collective (they must all-reduce, not train apart).
    """
    chosen = os.environ.get(STRATEGY_ENV)
    if chosen:
        return chosen
    if cluster is None or (cluster.num_replicas == 1 and not cluster.num_tasks("ps")):
        return "local"
    return "async" if cluster.num_tasks("ps") else "collective"


def for_request(kind, cluster, idle_ps: bool = False):
    """What a TF 1.x program's strategy request of ``kind`` (``tf.contrib.distribute``'s: collective, ps,
    mirrored) becomes on ``cluster`` under a front end that builds its own graph (the Estimator, tf-keras).

    All-reduce across several trainers: the registered collective strategy, bound (``idle_ps``: ps tasks may be
    there, holding nothing). Anything else: None, for one process's towers, or the ps tasks as TF 1.x's
    between-graph replication used them.
    """
    if kind != "collective" or cluster is None or cluster.num_replicas < 2 or (cluster.num_tasks("ps") and not idle_ps):
        return None
    return get("collective").bind(cluster, idle_ps=idle_ps)
