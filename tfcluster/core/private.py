"""Files only their owner may read: what tfcluster writes that says how to reach or run a cluster.

A task's log starts with its full argv (which may carry credentials or data
paths) and a cluster file lists every server's address, and TF's servers run
whatever graph they are sent (docs/pitfalls.md, item 7). So these are made
``0600`` (directories ``0700``) whatever the umask, rather than the usual
world-readable defaults.
"""

import os

FILE_MODE, DIR_MODE = 0o600, 0o700


def make_private_dir(path: str):
    """Create ``path`` (and its parents) readable by its owner only; an existing directory is left as it is."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)


def open_private(path: str, mode: str = "w", encoding=None):
    """``open(path, mode)`` for writing, the file created (or truncated) with mode 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)      # a file that existed keeps its old mode through os.open
        return os.fdopen(fd, mode, encoding=None if "b" in mode else (encoding or "utf-8"))
    except BaseException:
        os.close(fd)
        raise
