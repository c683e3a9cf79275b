"""Free ports: picking them, holding them, and naming the process that holds one."""

import os
import socket

import pytest

from tfcluster.topology.ports import PortReservation, pick_free_ports, port_holder, port_is_free


def plain_bind(port):
    """Bind the wildcard address as a server that does not share ports would."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("", port))
    finally:
        s.close()


def test_picked_ports_are_distinct_and_free():
    ports = pick_free_ports(5)
    assert len(ports) == 5 and len(set(ports)) == 5
    assert all(1024 <= p <= 65535 for p in ports)
    for p in ports:
        assert port_is_free(p)
        plain_bind(p)


def test_a_reservation_holds_its_ports_until_released():
    with PortReservation(2) as r:
        assert len(set(r.ports)) == 2
        for p in r.ports:
            assert not port_is_free(p)
            with pytest.raises(OSError):
                plain_bind(p)
        held = list(r.ports)
    for p in held:
        assert port_is_free(p)
        plain_bind(p)


def test_a_reservation_lets_a_port_sharing_server_bind_its_ports_and_take_their_connections():
    # What TF_GRPC_REUSE_PORT=1 asks of gRPC: bind beside the launcher's placeholder.
    with PortReservation(1) as r:
        port = r.ports[0]
        assert port != 0
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            server.bind(("", port))
            assert server.getsockname()[1] == port
            server.listen()
            server.settimeout(5)
            # The placeholder does not listen, so every client reaches the server. Were it listening, the
            # kernel would spread the connections over both, and of eight some would not reach the server.
            clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
            try:
                for _ in clients:
                    accepted, peer = server.accept()
                    accepted.close()
                    assert peer in [c.getsockname() for c in clients]
            finally:
                for c in clients:
                    c.close()
        finally:
            server.close()


def test_a_port_someone_listens_on_is_not_free_and_its_holder_is_named():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free(port)
        holder = port_holder(port)
        assert holder is not None and holder.startswith(f"pid {os.getpid()} (")
    finally:
        s.close()
    assert port_is_free(port)
    assert port_holder(port) is None


def test_the_suites_held_ports_stay_bound_until_a_server_answers_on_them_and_never_answered_ones_until_released():
    # tests/held_ports.py: how every test that starts servers on ports of its own holds them.
    from conftest import wait_until
    from held_ports import HeldPorts
    held = HeldPorts()
    served, silent = held(2)
    try:
        assert held.held == sorted([served, silent])
        with pytest.raises(OSError):
            plain_bind(served)                  # nothing else can take them meanwhile
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            server.bind(("", served))           # as a child with TF_GRPC_REUSE_PORT=1 binds beside the hold
            server.listen()
            wait_until(lambda: held.held == [silent], 10, f"the hold of port {served} to be let go")
        finally:
            server.close()
        assert port_is_free(served) and not port_is_free(silent)
    finally:
        held.release()
    assert held.held == [] and port_is_free(silent)
