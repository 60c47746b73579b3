"""The shared test helpers: a port handed to a server started next cannot be taken first."""

from __future__ import annotations

import socket

from conftest import free_port


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        return int(ports.read().split()[0])


def test_free_ports_lie_below_the_ephemeral_range_and_never_repeat():
    # A port inside the ephemeral range can become any outgoing connection's local port
    # before the server binds it; two equal ports would make two servers collide.
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < _ephemeral_low() for port in ports)


def test_a_free_port_can_be_bound_and_listened_on():
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert sock.getsockname()[1] == port
