"""The local launcher: a whole cluster on this machine from one command, supervised.

``tfcluster local --ps 1 --workers 2 -- python train.py`` is to a TF1 cluster
what torchrun is to PyTorch. The pipeline, in the order of its files:

- :mod:`.config`: one frozen, validated :class:`LaunchConfig` (the CLI builds it);
- :mod:`.plan`: the log dir, one held port per task, the cluster, each task's
  command and environment;
- :mod:`.processes`: each task in its own process group, its lines prefixed
  with its name (``[worker:1] ...``) and kept in one log file per task, and
  nothing left running at the end;
- :mod:`.exec_bound`: the first program of each task's process, which binds it
  to the launcher (and its cgroup) and execs the task's command;
- :mod:`.output`: whole lines from many tasks, and why a task failed;
- :mod:`.isolation`: the cluster in its own loopback-only network namespace;
- :mod:`.forked`: TF1-mode tasks forked from one process that imported
  TensorFlow once (:mod:`tfcluster.tf1.forkserver`), instead of each importing it;
- :mod:`.memory`: each ps in a memory cgroup of its own (``ps_memory``), and a
  ps the kernel killed for memory named as such;
- :mod:`.result`: how a run ended (:class:`RunResult`): why, its exit code, each task's end;
- :mod:`.task`: one task started on its own (``tfcluster start``, srun, a pod):
  its server hosted, or its command run as it, signals forwarded;
- :mod:`.supervisor`: restarts (``max_restarts``), the end of the run once the
  trainers are done, timeouts and signals, exit codes.
"""

from .config import LaunchConfig, check_command
from .output import LineWriter, failure_cause
from .result import Ending, RunResult, TaskResult
from .supervisor import LocalLauncher, run_local

__all__ = ["LaunchConfig", "LocalLauncher", "run_local", "check_command", "failure_cause", "LineWriter",
           "RunResult", "Ending", "TaskResult"]
