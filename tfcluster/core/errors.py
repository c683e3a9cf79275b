"""Every error tfcluster reports to a user: one line, never a traceback.

One family: each error is a :class:`TfclusterError` whose ``exit_code`` is
what the command line exits with (see :mod:`tfcluster.core.exits`). An error about
parameters names them in its message as ``{name}`` and lists them in
``params``: the library shows the parameter's own name
(``max_restarts must be ...``), the CLI its flag (``--max-restarts must be
...``, :meth:`TfclusterError.naming`), so the library never names a flag.
"""

import re
from typing import Mapping

from .exits import EXIT_UNREACHABLE, EXIT_USAGE


class TfclusterError(Exception):
    """A user-facing error: its message is one line that names the culprit."""

    #: exit code the CLI uses for this kind of error (2 = bad usage or input).
    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, params=()):
        self.params = tuple(params)
        self.template = message
        super().__init__(self.naming({}))

    def naming(self, names: Mapping[str, str]) -> str:
        """The message with each of its parameters called as ``names`` has it (a CLI flag), else by its name."""
        if not self.params:
            return self.template
        return re.sub(r"\{(\w+)\}", lambda m: names.get(m.group(1), m.group(1)) if m.group(1) in self.params
                      else m.group(0), self.template)


class SpecError(TfclusterError, ValueError):
    """A cluster description, option or parameter that is malformed or inconsistent."""


class PortInUseError(TfclusterError):
    """A task's port is already bound by another process."""


class IsolationError(TfclusterError):
    """Isolation was required and the cluster cannot have it: nothing was started."""


class DataError(TfclusterError):
    """A data file that is missing or not in the expected format."""


class ModelFnError(TfclusterError, ValueError):
    """``model_fn``, ``input_fn`` or the optimizer gave something tfcluster cannot train or evaluate."""


class ClusterUnreachableError(TfclusterError, TimeoutError):
    """Tasks that a process needs did not come up before its timeout."""

    exit_code = EXIT_UNREACHABLE

    def __init__(self, message, missing=()):
        super().__init__(message)
        self.missing = tuple(missing)


class RecoveryLimitError(TfclusterError):
    """A session was lost more often than ``max_recoveries`` allows."""

    exit_code = EXIT_UNREACHABLE


class StepTimeoutError(TfclusterError):
    """A training step outlasted its timeout although every task answers."""

    exit_code = EXIT_UNREACHABLE


class CheckpointSaveError(TfclusterError):
    """The final checkpoint could not be written (a full disk): the run's last good checkpoint is older."""

    exit_code = EXIT_UNREACHABLE


class ChiefLostError(TfclusterError):
    """The chief stopped answering for longer than its timeout: no one initialises or saves any more."""

    exit_code = EXIT_UNREACHABLE


class SyncStallError(TfclusterError):
    """A sync step waited longer than its stall timeout; the message names who is missing."""

    exit_code = EXIT_UNREACHABLE


class CollectiveError(TfclusterError):
    """A collective op failed or timed out; the message names the peers that do not answer."""

    exit_code = EXIT_UNREACHABLE


class TF1RemovedError(TfclusterError, ImportError):
    """A TF 1.x name that TF 2.21 no longer has; the message names the replacement.

    It is an ImportError so that ``from tensorflow.contrib.x import y`` reports
    it as it is (Python swallows AttributeErrors there), and so that scripts that
    guard optional imports with ``except ImportError`` still work.
    """

    def __init__(self, symbol: str, replacement: str, since: str = "2.x"):
        self.symbol = symbol
        self.replacement = replacement
        super().__init__(f"{symbol} is gone in TF {since}; use {replacement}")


class MissingSlimError(TF1RemovedError):
    """A TF 1.x name TF1 mode serves from tf-slim, which is not installed; names the extra that brings it."""

    def __init__(self, symbol: str, package: str, install: str):
        TfclusterError.__init__(self, f"{symbol} comes from the {package} package in TF1 mode, which is not "
                                      f"installed: {install}")
        self.symbol, self.replacement = symbol, install


class TensorFlowMissingError(TfclusterError, ImportError):
    """TensorFlow is not installed where tfcluster needs it; the message names the extra to install."""


class CheckpointUnreadable(TfclusterError):
    """A checkpoint that vanished (rotated away) or cannot be read (truncated) while it was being restored."""


class NoReadableCheckpoint(TfclusterError):
    """A checkpoint dir that holds checkpoints, none of them readable: training would silently start over."""


class HorovodNotInitialized(SpecError):
    """A Horovod call before ``hvd.init()`` (Horovod's own ValueError), in one line."""


class TF1ModeName(TfclusterError, AttributeError):
    """A name of TF 2.0-2.15 that tfcluster serves in TF1 mode (the Estimator's): one line naming ``--tf1``."""


class TF1ModeImport(TfclusterError, ImportError):
    """An import of the Estimator's package (``tensorflow_estimator``) in TF2 mode: one line naming ``--tf1``."""


class StrategyArgumentError(TfclusterError, ValueError):
    """A strategy TF 2.21 cannot build as asked on this machine or cluster: an argument, or the order of the
    program's lines (one line, exit 2)."""
