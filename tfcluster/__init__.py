"""tfcluster: run graph-mode TensorFlow 1 code on clusters of real processes.

The pipeline, lowest room first: ``cluster`` (where tasks live) -> ``ports``
-> ``server`` (a task's server, waits, shutdown) -> ``launch`` (processes) ->
``cli``. Importing tfcluster does not import TensorFlow.
"""

__version__ = "0.1.0"

from .errors import TfclusterError, SpecError, PortInUseError, ClusterUnreachableError  # noqa: E402
from .cluster import Cluster, Task  # noqa: E402
from .server import (start_server, server_from_tf_config, probe, wait_for_cluster,  # noqa: E402
                     serve_until_done, signal_done, quiet_tensorflow)

__all__ = ["Cluster", "Task", "TfclusterError", "SpecError", "PortInUseError", "ClusterUnreachableError",
           "start_server", "server_from_tf_config", "probe", "wait_for_cluster", "serve_until_done",
           "signal_done", "quiet_tensorflow"]
