"""Every ``TFCLUSTER_*`` environment variable, in one table: its name, who sets it, what it does.

Two kinds, as torchrun keeps its ``PET_*`` variables beside its flags:

- **options**: ``TFCLUSTER_<OPTION>`` sets ``--option`` of a command that
  reads the environment (:data:`OPTION_PREFIX`; ``tfcluster local``), for
  wrapper scripts under Slurm or Kubernetes. Two of them are also handed on
  to every task's command, which reads them as its default: ``--strategy``
  (:data:`STRATEGY`), ``--wire`` (:data:`WIRE`) and ``--math`` (:data:`MATH`).
- **the rest**: set by tfcluster for the processes it starts, or by you to
  change one behaviour; each is a :class:`Variable` below.

Code reads and sets them through these constants only (``tests/test_layout.py``
checks that no other module spells a ``TFCLUSTER_`` name).
"""

import os
from dataclasses import dataclass
from typing import Mapping, Optional

#: ``TFCLUSTER_<OPTION>`` sets ``--option`` of the commands that read the environment.
OPTION_PREFIX = "TFCLUSTER_"


@dataclass(frozen=True)
class Variable:
    """One ``TFCLUSTER_*`` variable: its name, who sets it, what it means."""

    name: str
    set_by: str
    meaning: str

    def get(self, environ: Optional[Mapping] = None, default: Optional[str] = None) -> Optional[str]:
        """Its value in ``environ`` (this process's environment by default), else ``default``."""
        return (os.environ if environ is None else environ).get(self.name, default)

    def __str__(self):
        return self.name


STRATEGY = Variable("TFCLUSTER_STRATEGY", "--strategy of local and start (or you)",
                    "the strategy fit and Keras use when the script names none")
WIRE = Variable("TFCLUSTER_WIRE", "--wire of local and start (or you)",
                "the type weights and gradients travel in when the strategy names none")
MATH = Variable("TFCLUSTER_MATH", "--math of local and start (or you)",
                "auto (the default: bfloat16 math where the CPU has AVX512-BF16 or AMX), bfloat16 or float32: the "
                "math of a trainer's matrix products")
PREFETCH = Variable("TFCLUSTER_PREFETCH", "you",
                    "0: an asynchronous ps step looks up its own batch's rows (the default, 1: it fetches the next "
                    "batch's rows while it trains on this one)")
RUN_ID = Variable("TFCLUSTER_RUN_ID", "tfcluster local (one per launch, kept across restarts), or you",
                  "which run a task belongs to (else Slurm's job id): a Keras fit's default checkpoint dir is "
                  "the run's, so a restarted task resumes it and another run starts afresh")
RESTART_COUNT = Variable("TFCLUSTER_RESTART_COUNT", "tfcluster local",
                         "how often the launcher restarted this task (0 at first); set only under the launcher")
PS_STATE_RECORD = Variable("TFCLUSTER_PS_STATE_RECORD", "tfcluster local, for every task",
                          "a file in which the chief (fit, Estimator, TF1 mode) writes the bytes of variables "
                          "(optimizer slots included) placed on each ps task, as JSON, for the launcher's "
                          "out-of-memory line")
DONE_RECORD = Variable("TFCLUSTER_DONE_RECORD", "tfcluster start, for its command",
                       "a file in which the command notes each ps it told that it is done")
TF_CHECKED = Variable("TFCLUSTER_TF_CHECKED", "tfcluster, once it checked the installed TensorFlow",
                      "the tasks a command starts do not repeat the TensorFlow install warnings")
DEBUG = Variable("TFCLUSTER_DEBUG", "you", "1: tfcluster's debug lines, everywhere")
SYNC_STALL_SECS = Variable("TFCLUSTER_SYNC_STALL_SECS", "you",
                           "seconds a sync step waits before it names the workers it waits for (default 30)")
SYNC_TIMEOUT_SECS = Variable("TFCLUSTER_SYNC_TIMEOUT_SECS", "you",
                             "seconds a sync step waits for a missing worker before it stops (default 600)")
TF1_READY_POLL_SECS = Variable("TFCLUSTER_TF1_READY_POLL_SECS", "you",
                               "TF1 mode: seconds between 'is the model ready?' polls (TF's default is 30)")
TF1_STOP_GRACE_SECS = Variable("TFCLUSTER_TF1_STOP_GRACE_SECS", "you",
                               "TF1 mode: seconds a closing MonitoredSession waits for its threads (TF's is 120)")

START_OVER = Variable("TFCLUSTER_START_OVER", "you",
                      "1: a chief whose checkpoint dir holds checkpoints, none readable, moves them to unreadable/ "
                      "and trains from step 0 (without it, it stops in one line)")

#: Every variable of the table.
VARIABLES = (STRATEGY, WIRE, MATH, PREFETCH, RUN_ID, RESTART_COUNT, PS_STATE_RECORD, DONE_RECORD, TF_CHECKED, DEBUG,
             SYNC_STALL_SECS, SYNC_TIMEOUT_SECS, TF1_READY_POLL_SECS, TF1_STOP_GRACE_SECS, START_OVER)


def option_variable(flag: str) -> str:
    """``TFCLUSTER_MAX_RESTARTS`` for ``--max-restarts``: the variable that sets a command's option."""
    return OPTION_PREFIX + flag.lstrip("-").replace("-", "_").upper()
