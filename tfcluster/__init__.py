"""tfcluster: run graph-mode TensorFlow 1 code on clusters of real processes.

The pipeline, lowest room first: ``cluster`` (where tasks live) -> ``ports``
-> ``server`` (a task's server, waits, shutdown) -> ``placement`` and
``strategies`` (how the graph is replicated) -> ``session`` -> ``train``
(fit / evaluate / predict) -> ``launch`` (processes) -> ``cli``. Importing
tfcluster does not import TensorFlow; the training names load on first use.
"""

__version__ = "0.1.0"

from .errors import TfclusterError, SpecError, PortInUseError, ClusterUnreachableError  # noqa: E402
from .cluster import Cluster, Task  # noqa: E402
from .server import (start_server, server_from_tf_config, probe, wait_for_cluster,  # noqa: E402
                     serve_until_done, signal_done, quiet_tensorflow)

# Names whose modules import TensorFlow: resolved lazily, so the CLI stays fast.
_LAZY = {
    "fit": "train", "evaluate": "train", "predict": "train", "run_evaluator": "train", "FitResult": "train",
    "ModelOutput": "strategies", "InputContext": "strategies", "Mode": "strategies",
    "ParameterServerStrategy": "strategies", "LocalStrategy": "strategies",
    "ReplicaContext": "strategies", "SyncStallError": "strategies",
    "ByteBalancedSetter": "placement", "placement_report": "placement", "PlacementReport": "placement",
    "device_setter": "placement", "partition_big_variables": "placement",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfcluster' has no attribute {name!r}")


__all__ = ["Cluster", "Task", "TfclusterError", "SpecError", "PortInUseError", "ClusterUnreachableError",
           "start_server", "server_from_tf_config", "probe", "wait_for_cluster", "serve_until_done",
           "signal_done", "quiet_tensorflow", *_LAZY]
