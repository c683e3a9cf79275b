"""The first program a task runs: it binds itself to the launcher, then becomes the task's command.

Run as ``python -I -S exec_bound.py LAUNCHER_PID CGROUP_PROCS EXECUTABLE ARGV...``
(CGROUP_PROCS empty for none): it joins the memory cgroup (``--ps-memory``),
asks Linux to SIGKILL it when the launcher dies (``PR_SET_PDEATHSIG``, kept
across exec), and execs the task's command in its own pid.

Why a program and not a ``preexec_fn``: Python code between fork and exec in
the launcher, which has threads and gRPC channels (its port probes), is
undefined behaviour; gRPC's own fork handlers then crash the child with
SIGABRT before it execs (grpc/grpc#43055; a restarted worker died so on CI).
Without a ``preexec_fn`` Python starts children with vfork, where no fork
handler runs. This file imports nothing but the standard library, and Python
starts it without ``site`` (``-S``), in a few milliseconds.
"""

import ctypes
import os
import sys

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9


def _fail(message: str, code: int):
    os.write(2, f"tfcluster: error: {message}\n".encode())
    os._exit(code)


def main(argv):
    """Join the cgroup, bind to the launcher, exec the command (``argv`` as in the module doc)."""
    launcher, procs, executable, command = int(argv[1]), argv[2], argv[3], argv[4:]
    if procs:
        try:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError as e:
            # Never run unlimited: the launcher names this line as the task's failure.
            _fail(f"cannot join memory cgroup {os.path.dirname(procs)}: {e.strerror}", 1)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    if os.getppid() != launcher:    # the launcher died before prctl took effect
        os._exit(1)
    try:
        os.execv(executable, command)
    except OSError as e:            # the launcher resolved it; it changed since
        _fail(f"cannot run {command[0]!r}: {e.strerror}", 127)


if __name__ == "__main__":
    main(sys.argv)
