"""What this system offers the launcher, and what is off where a POSIX feature is missing.

On Linux tfcluster uses four features beyond plain POSIX processes:

- ``prctl(PR_SET_PDEATHSIG)``: a task dies with its launcher, even when the
  launcher is killed by SIGKILL;
- ``prctl(PR_SET_CHILD_SUBREAPER)``: orphans of a task are adopted by the
  launcher, which stops them at the end;
- ``unshare(CLONE_NEWNET)``: the local cluster runs in a network namespace of
  its own (README, Security);
- ``SIGHUP``: closing a terminal ends its task cleanly.

Elsewhere (macOS, the BSDs, containers whose seccomp profile refuses them)
each one that is missing degrades on its own, and :func:`missing_features`
says, in one line each, what is off. Every probe is a function, looked up at
call time, so nothing here fails at import and a test can switch one off.
"""

import signal
import sys
from typing import Optional

_UNSET = object()
_libc_cache = _UNSET


def libc():
    """The C library, for prctl and unshare (None where there is none to load)."""
    global _libc_cache
    if _libc_cache is _UNSET:
        try:
            import ctypes
            _libc_cache = ctypes.CDLL(None, use_errno=True)
        except (OSError, ImportError, AttributeError):
            _libc_cache = None
    return _libc_cache


def _linux_call(name: str):
    if not sys.platform.startswith("linux"):
        return None
    lib = libc()
    return getattr(lib, name, None) if lib is not None else None


def prctl():
    """Linux's ``prctl`` as a C function, or None where there is none."""
    return _linux_call("prctl")


def unshare():
    """Linux's ``unshare`` as a C function, or None where there is none."""
    return _linux_call("unshare")


def hangup_signal() -> Optional[int]:
    """``signal.SIGHUP``, or None where the system has no hang-up signal."""
    return getattr(signal, "SIGHUP", None)


def stop_signals() -> tuple:
    """The signals that stop a launcher or a task cleanly: SIGINT, SIGTERM and, where there is one, SIGHUP."""
    hup = hangup_signal()
    return (signal.SIGINT, signal.SIGTERM) + ((hup,) if hup is not None else ())


def take_signals(handler, signals=None) -> dict:
    """Route ``signals`` (:func:`stop_signals` by default) to ``handler``; returns ``{signal: previous
    handler}`` for :func:`give_back_signals`. Outside the main thread, where Python installs no handler,
    nothing changes and the dict is empty: the caller's stop comes by other means there."""
    import threading
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for s in stop_signals() if signals is None else signals:
        try:
            previous[s] = signal.signal(s, handler)
        except (OSError, ValueError):
            pass
    return previous


def give_back_signals(previous: dict):
    """Put back the handlers :func:`take_signals` replaced (the default one where C code had installed its own)."""
    for s, h in previous.items():
        try:
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass


def missing_features() -> list:
    """One line per missing feature, saying what is off.

    Network namespaces are not among them: the launcher's ``isolation: off
    (why)`` line already says so when it wanted one.
    """
    lines = []
    if prctl() is None:
        lines.append("no prctl() here: a task outlives a launcher killed by SIGKILL, and orphans of a task "
                     "are found only by walking process trees (Ctrl-C and SIGTERM still stop everything)")
    if hangup_signal() is None:
        lines.append("no SIGHUP here: closing the terminal does not stop tasks cleanly (Ctrl-C and SIGTERM do)")
    return lines
