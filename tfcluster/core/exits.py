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

import atexit
import os
import signal
import sys
import threading

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


def run_as_main(main, *args, forked: bool = False):
    """Run ``main(*args)`` as a program's main and end the process with its result, as ``sys.exit(main())`` would.

    Once TensorFlow is imported, the interpreter's teardown of its modules costs 1.3-2 s of CPU (docs/tf1.md, "How
    the tasks start"), paid by every ps, TF1-mode task and fork server at exit, the launcher waiting on it. So then
    the process ends as Python's own exit does up to that teardown (the error printed by ``sys.excepthook``,
    non-daemon threads joined, atexit handlers run, the streams flushed; Ctrl-C's death by SIGINT), and leaves.
    Without TensorFlow it exits as usual. ``forked``: a task forked from a server, which must never return.
    """
    try:
        code = main(*args)
    except BaseException as e:  # noqa: BLE001 - as the interpreter does: each kind of end to its exit
        if not (forked or "tensorflow" in sys.modules):
            raise
        code = _reported(e)
    else:
        if not (forked or "tensorflow" in sys.modules):
            sys.exit(code)
    _leave(code)


def _reported(error: BaseException):
    """The exit code of an exception that ended the program (a negative signal for Ctrl-C), printed as Python does."""
    if isinstance(error, SystemExit):
        if error.code is None or isinstance(error.code, int):
            return error.code or 0
        sys.stderr.write(f"{error.code}\n")
        return 1
    sys.excepthook(type(error), error, error.__traceback__)
    return -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1


def _leave(code):
    """Python's exit without its teardown: threads, atexit handlers, flushed streams, then ``os._exit``."""
    code = code if isinstance(code, int) else 1
    try:
        shutdown = getattr(threading, "_shutdown", None)    # joins the non-daemon threads, as Py_FinalizeEx does
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if code < 0:                                        # as CPython ends after an uncaught KeyboardInterrupt
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code & 0xFF if code >= 0 else from_signal(-code))
