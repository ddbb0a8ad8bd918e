"""Which processes listen on TCP ports of this node.

A listener of another user shows without its process (its pid is not readable to a user
who is not root): `Listener.pid` is None then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: its port and address, and the process holding it if known."""

    port: int
    address: str
    pid: int | None

    def describe(self) -> str:
        if self.pid is None:
            return f"a process of another user on {self.address}:{self.port}"
        try:
            process = psutil.Process(self.pid)
            who = f"{process.name()}, uid {process.uids().effective}"
        except psutil.Error:
            who = "ended since"
        return f"pid {self.pid} ({who}) on {self.address}:{self.port}"


def listeners(ports: Iterable[int]) -> dict[int, list[Listener]]:
    """Every listening TCP socket (IPv4 and IPv6, any address) on each of `ports`."""
    found: dict[int, list[Listener]] = {port: [] for port in ports}
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port in found:
            found[conn.laddr.port].append(Listener(conn.laddr.port, conn.laddr.ip, conn.pid))
    return found
