"""Test hosts: Linux network namespaces joined by a switch, each with its own address.

``Hosts(n)`` makes namespaces ``<prefix>-h0 .. h<n-1>`` and a switch namespace
holding a bridge; each host has an ``eth0`` on the bridge with an address in
169.254.77.0/24. Link-local addresses cannot be routed anywhere, so traffic
between test hosts can never leave this machine. ``cut(i)``/``mend(i)`` take a
host's link down and up, as a pulled cable would.
"""

import os
import shutil
import subprocess
import uuid

SUBNET = "169.254.77"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def unavailable_reason():
    """Why namespaces cannot be made here, or None when they can."""
    if not shutil.which("ip"):
        return "the 'ip' command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"tfc-probe-{uuid.uuid4().hex[:6]}"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


class Hosts:
    """``n`` namespaced test hosts on one switch; use as a context manager."""

    def __init__(self, n: int):
        self.prefix = f"tfc{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.prefix}-sw"
        self.names = [f"{self.prefix}-h{i}" for i in range(n)]
        self.addresses = [f"{SUBNET}.{10 + i}" for i in range(n)]
        self._made = []

    def __enter__(self):
        try:
            self._make()
        except Exception:
            self.close()
            raise
        return self

    def _make(self):
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.names, self.addresses)):
            _ip("netns", "add", ns)
            self._made.append(ns)
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0")
            _ip("-n", self.switch, "link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def exec_prefix(self, i: int) -> list:
        """The argv prefix that runs a command on host ``i``."""
        return ["ip", "netns", "exec", self.names[i]]

    def cut(self, i: int):
        """Take host ``i``'s link down: its packets go nowhere until :meth:`mend`."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "down")

    def mend(self, i: int):
        """Bring host ``i``'s link back up."""
        _ip("-n", self.switch, "link", "set", f"p{i}", "up")

    def close(self):
        """Delete every namespace this object made (their veths go with them)."""
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []

    def __exit__(self, *exc):
        self.close()
