"""Isolation: the whole local cluster in a network namespace of its own, with only loopback.

TensorFlow's servers listen on every interface and run whatever graph they
are sent (docs/pitfalls.md, item 7). :func:`isolate_network` moves the
launcher, and so every task it starts afterwards, into a new network
namespace whose only interface is loopback: no other host can reach the
cluster, and the cluster cannot reach the network.
"""

import errno
import os
import socket
import sys
from typing import Optional

from ..core import posix
from ..core.errors import IsolationError, TfclusterError
from ..topology.cluster import is_loopback, parse_address
from .config import LaunchConfig

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000


def _unshare(flags: int):
    import ctypes
    call = posix.unshare()
    if call is None:
        raise OSError(errno.ENOSYS, "no unshare() in this system's C library")
    if call(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _loopback_up():
    import fcntl
    import struct
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, siocgifflags, ifreq))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))


def isolate_network() -> Optional[str]:
    """Move this process into a new network namespace with only loopback, up; None, or why it cannot.

    As root that takes CAP_SYS_ADMIN only; otherwise a user namespace of our
    own grants it (where the system allows unprivileged user namespaces, and
    only while the process has a single thread). It is for good: the process
    and every child it starts afterwards see no network but loopback.
    """
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if posix.unshare() is None:
        return "no network namespaces here (no unshare() in the C library)"
    try:
        _unshare(_CLONE_NEWNET)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EACCES):
            return f"cannot create a network namespace: {e.strerror}"
        uid, gid = os.getuid(), os.getgid()
        try:
            _unshare(_CLONE_NEWUSER | _CLONE_NEWNET)
        except OSError as e2:
            return f"cannot create a network namespace: {e2.strerror}"
        try:
            # Keep our own uid and gid inside, so files the tasks write are ours outside.
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as e3:
            # There is no way back from here: say so rather than run half-isolated.
            raise TfclusterError(f"isolation failed: cannot map this user into its new user namespace "
                                 f"({e3.strerror}); run the cluster without isolation") from None
    try:
        _loopback_up()
    except OSError as e:
        raise TfclusterError(f"isolation failed: cannot bring loopback up in the new network namespace "
                             f"({e.strerror}); run the cluster without isolation") from None
    return None


def isolate_launch(config: LaunchConfig):
    """``(isolated, the line that says so)``: isolate this launcher when ``config`` asks and the system allows.

    A cluster with a task off loopback cannot be isolated (its tasks must reach
    each other over the network); the line then says why not. Where
    ``config.require_isolation``, that is an error instead: nothing has started.
    """
    exposed = ("every task's server listens on all interfaces with no authentication; "
               "keep this machine on a trusted network, or ask for {require_isolation}")
    if not config.isolate:
        return False, "isolation: off (--no-isolate): " + exposed.format(require_isolation="--require-isolation")
    hosts = ([parse_address(config.cluster.address(t))[0] for t in config.cluster.tasks()]
             if config.cluster is not None else [config.host])
    remote = [h for h in hosts if not is_loopback(h)]
    why = f"{remote[0]} is not a loopback address" if remote else isolate_network()
    if why is not None:
        if config.require_isolation:
            raise IsolationError(f"{{require_isolation}}: the cluster cannot be isolated ({why}); nothing was "
                                 f"started", params=["require_isolation"])
        return False, f"isolation: off ({why}): " + exposed.format(require_isolation="--require-isolation")
    return True, ("isolation: on: the cluster runs in its own network namespace with only loopback, so no other "
                  "host can reach its ports, and its tasks cannot reach the network (--no-isolate to turn off)")
