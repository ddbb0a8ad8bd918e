"""HTTP servers in processes of their own, for tests of who may be sent a run's Ray token: one
of the run's (its tag in the environment, as every Ray process of the run carries it) or one
of another local user's (uid 4242, through ``setpriv``; tests that need one skip without it).

Each server answers every request like Ray's job server answers its version check, and
reports the ``Authorization`` header of each request on its standard output.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from harness.run_tag import TAG_VAR

OTHER_UID = 4242
ANOTHER_USER = ("setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups")

_SERVER = """
import http.server, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self):
        print("authorization:", self.headers.get("Authorization"), flush=True)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"version": "4", "ray_version": "2.60.0", "ray_commit": "x"}')

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("listening", flush=True)
server.serve_forever()
"""


def another_user_or_skip() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second local user")


class Server:
    """A running server; `headers()` is what it reported until it was stopped."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> list[str]:
        """Stop it; the ``Authorization`` headers it was sent (``None`` for none)."""
        self.process.terminate()
        out, _ = self.process.communicate(timeout=10)
        return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("auth")]


@contextlib.contextmanager
def http_server(port: int, *, tag: str | None = None, other_user: bool = False) -> Iterator[Server]:
    """A server on 127.0.0.1:`port`, carrying run tag `tag`, or run as another user."""
    prefix = ANOTHER_USER if other_user else ()
    env = {**os.environ, **({TAG_VAR: tag} if tag else {})}
    process = subprocess.Popen(
        [*prefix, sys.executable, "-c", _SERVER, str(port)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    server = Server(process)
    try:
        assert process.stdout is not None and process.stdout.readline() == "listening\n"
        yield server
    finally:
        if process.poll() is None:
            server.stop()
