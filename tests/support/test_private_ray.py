"""The test helpers' port draws: the ports of one run never repeat."""

from __future__ import annotations

import socket

from tests.support.private_ray import LauncherPorts, free_ports


def test_ports_drawn_together_are_distinct_and_free() -> None:
    """500: drawn one socket at a time (each closed before the next), 500 ports repeat 6 to 11
    of them on Linux (measured), the repeat that once failed a private Ray's start."""
    ports = free_ports(500)
    assert len(set(ports)) == 500
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_launchers_ports_go_to_its_four_port_options() -> None:
    ports = LauncherPorts.draw()
    assert len(set(ports)) == 4
    assert ports.argv() == [
        "--ray-port", str(ports.ray), "--dashboard-port", str(ports.dashboard),
        "--agent-port", str(ports.agent), "--client-server-port", str(ports.client_server),
    ]  # fmt: skip
