"""A private local Ray cluster for live tests on a machine that may run other people's Ray.

``ray stop`` and the launchers' process cleanup end every Ray process of the node. This
cluster's processes run under a tag in their environment (inherited by every Ray process and
job) with their own temp dir and ports, and only processes carrying the tag are stopped.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import psutil

from harness.live import run_step
from harness.steps import ProcessCleanup, RayStart, RayStop, Step

TAG = "GRPO_TEST_RAY_TAG"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRay:
    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex
        # short: Ray's socket paths under it must stay below the 107-byte limit
        self.temp_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        self.ray_port, self.dashboard_port = free_port(), free_port()
        self.ran: list[str] = []
        self.seen_processes = 0
        self.jobs: list[tuple[str, str]] = []  # (entrypoint, status) seen before Ray stopped

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

    def run(self, step: Step, env: Mapping[str, str]) -> None:
        """A live step runner that keeps the plan's Ray to this cluster."""
        self.ran.append(step.kind)
        env = {**env, **self.env}
        if isinstance(step, ProcessCleanup):
            return  # it would kill other people's Ray and trainers
        if isinstance(step, RayStop):
            self._record_jobs()
            self.stop()
            return
        if isinstance(step, RayStart):
            (command,) = step.commands()
            argv = [*command.argv, "--temp-dir", self.temp_dir]
            argv += ["--ray-client-server-port", str(free_port())]
            argv += ["--dashboard-agent-listen-port", str(free_port())]
            subprocess.run(argv, env={**env, **command.env}, check=True)
            self.seen_processes = len(self.processes())
            return
        run_step(step, env)

    def _record_jobs(self) -> None:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(f"http://127.0.0.1:{self.dashboard_port}")
        deadline = time.time() + 10
        while True:
            jobs = client.list_jobs()
            if all(job.status.is_terminal() for job in jobs) or time.time() > deadline:
                break
            time.sleep(0.5)
        self.jobs = [(job.entrypoint, job.status.value) for job in jobs]
