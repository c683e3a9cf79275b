"""Free ports on this host: finding them, holding them, and naming who holds one.

A launcher picks every port of a cluster at once and keeps the sockets bound
(with SO_REUSEPORT, not listening) until its children's servers have bound
them too, so no other process can take a port in between. Children then need
``TF_GRPC_REUSE_PORT=1`` so that TensorFlow's gRPC server may share the port
with the launcher's placeholder; :data:`REUSE_ENV` carries that setting.
"""

import errno
import socket
from typing import Optional

#: Environment that lets a child's TF server bind a port the launcher holds.
REUSE_ENV = {"TF_GRPC_REUSE_PORT": "1"}


def _family(host: str):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bind_host(host: str) -> str:
    # TF's server binds the wildcard address whatever host its spec names, so
    # a port is only free for it if it is free on every interface.
    return "::" if ":" in host else ""


def _placeholder(port: int, host: str) -> socket.socket:
    """A socket bound (not listening) to ``port``, shareable with the task's server (SO_REUSEPORT)."""
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((_bind_host(host), port))
    except OSError:
        s.close()
        raise
    return s


class PortReservation:
    """Ports held open by this process until :meth:`release` (or ``with`` exit).

    ``count`` free ports, or exactly the given ``ports`` (OSError if one is taken).
    """

    def __init__(self, count: int = 1, host: str = "localhost", ports=None):
        self._sockets = []
        try:
            for port in (ports if ports is not None else [0] * count):
                self._sockets.append(_placeholder(port, host))
        except OSError:
            self.release()
            raise
        self.ports = [s.getsockname()[1] for s in self._sockets]

    def release(self):
        """Close the placeholder sockets; the ports are then anyone's."""
        for s in self._sockets:
            s.close()
        self._sockets = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def hold_port(port: int, host: str = "localhost") -> Optional[PortReservation]:
    """Hold one given port (a task's, while it restarts); None when another process has it."""
    try:
        return PortReservation(host=host, ports=[port])
    except OSError:
        return None


def pick_free_ports(count: int, host: str = "localhost") -> list:
    """``count`` distinct ports that are free right now (not held afterwards)."""
    with PortReservation(count, host) as r:
        return list(r.ports)


def port_is_free(port: int, host: str = "localhost") -> bool:
    """True when nothing is bound to ``port`` on the wildcard address."""
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    # Like gRPC's own bind: connections of a task that just died (TIME_WAIT)
    # must not make its port look taken to the task restarted in its place.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((_bind_host(host), port))
        return True
    except OSError as e:
        if e.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        raise
    finally:
        s.close()


def port_holder(port: int) -> Optional[str]:
    """Describe the process listening on ``port`` (``pid 123 (python train.py)``), if psutil can tell."""
    try:
        import psutil
        conns = psutil.net_connections(kind="inet")
    except Exception:  # psutil missing, or not allowed to look: say nothing rather than guess
        return None
    pids = sorted({c.pid for c in conns if c.laddr and c.laddr.port == port
                   and c.status == "LISTEN" and c.pid})
    if not pids:
        return None
    descs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            # One line, whatever the command line holds (python -c "..." may hold newlines).
            cmd = " ".join(" ".join(p.cmdline()[:4]).split()) or p.name()
            cmd = cmd if len(cmd) <= 80 else cmd[:77] + "..."
            descs.append(f"pid {pid} ({cmd})")
        except Exception:
            descs.append(f"pid {pid}")
    return ", ".join(descs)
