"""A private local Ray for live tests on a machine that may run other people's Ray.

Its processes run under a tag in their environment (inherited by every Ray process and job)
with their own temp dir and ports, and only processes carrying the tag are stopped. Tests use
it as the Ray that ``train.py`` starts by itself, and as a *foreign* Ray (`start_head`) that a
launcher's live run must leave alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import NamedTuple

import psutil

TAG = "GRPO_TEST_RAY_TAG"


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports of this host.

    The sockets stay bound until all are picked: the kernel may hand out a port again once
    its socket is closed, and two services of one run given the same port fail to start.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def free_port() -> int:
    (port,) = free_ports(1)
    return port


class LauncherPorts(NamedTuple):
    """The ports a launcher's own Ray listens on, drawn together so that no two are the same."""

    ray: int
    dashboard: int
    agent: int
    client_server: int

    @classmethod
    def draw(cls) -> LauncherPorts:
        return cls(*free_ports(4))

    def argv(self) -> list[str]:
        return [
            *("--ray-port", str(self.ray), "--dashboard-port", str(self.dashboard)),
            *("--agent-port", str(self.agent), "--client-server-port", str(self.client_server)),
        ]


class PrivateRay:
    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex
        # short: Ray's socket paths under it must stay below the 107-byte limit
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        self.ray_port, self.dashboard_port, self.client_server_port, self.agent_port = free_ports(4)

    @property
    def env(self) -> dict[str, str]:
        """Environment of every process of this cluster.

        Token authentication is off: with it, ``ray start`` turns it on whenever
        ``~/.ray/auth_token`` exists, and this process's job client would need
        ``RAY_AUTH_MODE=token`` set before Ray reads its configuration.
        """
        return {TAG: self.tag, "RAY_TMPDIR": self.temp_dir, "RAY_AUTH_MODE": "disabled"}

    def processes(self) -> list[psutil.Process]:
        """Processes with this cluster's tag in their environment or a file in its temp dir.

        Both: Ray's process titles may overwrite the environment block, and a process may
        have no file open yet; every Ray process logs into the temp dir.
        """
        marker = f"{TAG}={self.tag}".encode()
        found = []
        for proc in psutil.process_iter():
            if proc.pid == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
                fds = Path(f"/proc/{proc.pid}/fd")
                targets = [os.readlink(fd) for fd in fds.iterdir()]
            except OSError:
                continue
            if marker in environ.split(b"\0") or any(
                t.startswith(self.temp_dir + "/") for t in targets
            ):
                found.append(proc)
        return found

    def stop(self) -> None:
        """SIGKILL every process carrying this cluster's tag (``ray stop --force`` for it)."""
        for _ in range(10):
            procs = self.processes()
            if not procs:
                return
            for proc in procs:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    continue
            psutil.wait_procs(procs, timeout=5)
        raise RuntimeError(f"processes of the private Ray survive: {self.processes()}")

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def start_head(self) -> None:
        """``ray start --head`` of this cluster: one CPU, its own temp dir and ports."""
        ray = str(Path(sys.executable).with_name("ray"))
        argv = [
            *(ray, "start", "--head", "--node-ip-address", "127.0.0.1"),
            *("--port", str(self.ray_port), "--dashboard-port", str(self.dashboard_port)),
            *("--num-cpus", "1", "--num-gpus", "0", "--temp-dir", self.temp_dir),
            *("--ray-client-server-port", str(self.client_server_port)),
            *("--dashboard-agent-listen-port", str(self.agent_port), "--disable-usage-stats"),
        ]
        subprocess.run(argv, env={**os.environ, **self.env}, check=True, capture_output=True)
