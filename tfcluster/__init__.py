"""tfcluster: run graph-mode TensorFlow 1 code on clusters of real processes.

The pipeline, lowest room first (README, Layout): the rules everything shares
(``errors``, ``exits``, ``taskenv``, ``logs``, ``tferrors``, ``duplicates``),
``cluster`` (where tasks live) and ``ports`` -> ``server`` (a task's server,
waits, shutdown) -> ``model``, ``placement`` and ``strategies`` (how the graph
is replicated) -> ``session`` and ``loop`` with its ``hooks`` -> ``train`` and
``evaluation`` (fit / evaluate / predict) -> ``launch`` (processes) and ``tf1``
-> ``cli``. Importing tfcluster does not import TensorFlow; the training names
load on first use.
"""

from .core.errors import ClusterUnreachableError, PortInUseError, SpecError, TfclusterError  # noqa: E402
from .core.version import __version__  # noqa: E402,F401
from .runtime.server import probe, server_from_tf_config, start_server, wait_for_cluster  # noqa: E402
from .runtime.shutdown import serve_until_done, signal_done  # noqa: E402
from .topology.cluster import Cluster, Role, Task  # noqa: E402
from .topology.taskenv import quiet_tensorflow  # noqa: E402

# Names whose modules import TensorFlow when used: resolved lazily, so the CLI stays fast.
_LAZY = {
    "fit": "training.train", "FitResult": "training.train", "FitConfig": "training.train",
    "evaluate": "training.evaluation", "predict": "training.evaluation", "run_evaluator": "training.evaluation",
    "ModelOutput": "graph.model", "InputContext": "graph.model", "Mode": "graph.model",
    "ReplicaContext": "graph.model",
    "Hook": "graph.step", "RunArgs": "graph.step",
    "ParameterServerStrategy": "strategies", "LocalStrategy": "strategies", "SyncStallError": "core.errors",
    "ByteBalancedSetter": "graph.placement", "placement_report": "graph.placement",
    "PlacementReport": "graph.placement", "device_setter": "graph.placement",
    "partition_big_variables": "graph.placement",
    "TrafficHook": "graph.traffic", "step_traffic": "graph.traffic",
    "get_embedding_variable": "embedding", "embedding_lookup": "embedding",
    "EmbeddingVariableOption": "embedding", "InitializerOption": "embedding", "CounterFilter": "embedding",
    "CBFFilter": "embedding", "GlobalStepEvict": "embedding", "L2WeightEvict": "embedding",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfcluster' has no attribute {name!r}")


__all__ = ["__version__", "Cluster", "Role", "Task", "TfclusterError", "SpecError", "PortInUseError", "ClusterUnreachableError",
           "start_server", "server_from_tf_config", "probe", "wait_for_cluster", "serve_until_done",
           "signal_done", "quiet_tensorflow", *_LAZY]
