"""What tfcluster's exit codes mean, and how a child's end becomes one.

| code | meaning |
|---|---|
| 0 | success |
| 1 | ``status``: a task is down |
| 2 | bad usage or input (one line on stderr: ``tfcluster: error: ...``) |
| 3 | a peer lost: timed out waiting for the cluster's tasks; a session, sync step or collective that cannot go on; a chief or ps that stopped answering; a final checkpoint that could not be written |
| 124 | ``local --timeout`` expired |
| 128+N | the task (or the launcher) died of signal N: 130 after Ctrl-C, 143 after SIGTERM |
| other | a failing worker's own exit code |
"""

import signal

EXIT_OK = 0
EXIT_DOWN = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_TIMEOUT = 124


def from_signal(signum: int) -> int:
    """The shell's exit status for death by signal ``signum``: 128+N."""
    return 128 + int(signum)


def exit_status(returncode: int) -> int:
    """A Popen return code as a shell exit status: 128+N for death by signal N."""
    return from_signal(-returncode) if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """``exited with code 3`` or ``was killed by SIGKILL``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"
