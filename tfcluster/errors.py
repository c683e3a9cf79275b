"""Errors that tfcluster reports to a user as one line, never as a traceback."""


class TfclusterError(Exception):
    """A user-facing error: its message is one line that names the culprit."""

    #: exit code the CLI uses for this kind of error (2 = bad usage or input).
    exit_code = 2


class SpecError(TfclusterError, ValueError):
    """A cluster description that is malformed or inconsistent."""


class PortInUseError(TfclusterError):
    """A task's port is already bound by another process."""


class ClusterUnreachableError(TfclusterError, TimeoutError):
    """Tasks that a process needs did not come up before its timeout."""

    exit_code = 3

    def __init__(self, message, missing=()):
        super().__init__(message)
        self.missing = tuple(missing)
