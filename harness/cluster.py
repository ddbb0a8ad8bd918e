"""Waiting for a multi-node Ray cluster: the head for its nodes, a worker for its head.

    python -m harness.cluster wait --address HEAD:6379 --nodes 2 --gpus 16 --timeout 600
    python -m harness.cluster wait-head --address HEAD:6379 --token-file PATH --timeout 600

Each ends within its timeout: exit 0 when the cluster is ready, else one line and exit 1.
`wait` connects as a Ray driver, so it needs the cluster's token authentication in its
environment (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``), as the launcher sets it.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from functools import partial

from common.command_line import run_command
from harness.private_files import NotPrivate, check_private_file

_POLL_S = 2.0


class NotReady(Exception):
    """The cluster did not reach its size, or the head did not answer, in time (one line)."""


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise NotReady(f"not a HOST:PORT address: {address!r}")
    return host, int(port)


def wait_head(address: str, token_file: str, timeout_s: float) -> None:
    """Until the GCS at `address` accepts a connection and `token_file` exists; the token must
    be private to this user (the head's claim made it so), else it may be someone else's."""
    host, port = _split(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=_POLL_S):
                reachable = True
        except OSError:
            reachable = False
        if reachable and os.path.isfile(token_file):
            try:
                check_private_file(token_file)
            except NotPrivate as err:
                raise NotReady(f"refused the head's token: {err}") from None
            return
        if time.monotonic() >= deadline:
            missing = (
                f"the head {address} did not answer"
                if not reachable
                else (f"the head's token {token_file} did not appear")
            )
            raise NotReady(f"{missing} within {timeout_s:.0f} s")
        time.sleep(_POLL_S)


def wait_cluster(address: str, nodes: int, gpus: int, timeout_s: float) -> None:
    """Until the cluster at `address` has `nodes` alive nodes and `gpus` GPUs."""
    import ray

    deadline = time.monotonic() + timeout_s
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        while True:
            alive = [node for node in ray.nodes() if node.get("Alive")]
            found = int(sum(node.get("Resources", {}).get("GPU", 0) for node in alive))
            if len(alive) >= nodes and found >= gpus:
                return
            if time.monotonic() >= deadline:
                raise NotReady(
                    f"the cluster at {address} has {len(alive)} of {nodes} nodes and {found} of "
                    f"{gpus} GPUs after {timeout_s:.0f} s (are the workers started?)"
                )
            time.sleep(_POLL_S)
    finally:
        ray.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    wait = commands.add_parser("wait", help="the head: wait for the cluster's nodes and GPUs")
    wait.add_argument("--address", required=True)
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--gpus", type=int, required=True)
    wait.add_argument("--timeout", type=float, required=True)
    head = commands.add_parser("wait-head", help="a worker: wait for the head and its token")
    head.add_argument("--address", required=True)
    head.add_argument("--token-file", required=True)
    head.add_argument("--timeout", type=float, required=True)
    options = parser.parse_args(argv)
    if options.command == "wait":
        action = partial(
            wait_cluster, options.address, options.nodes, options.gpus, options.timeout
        )
    else:
        action = partial(wait_head, options.address, options.token_file, options.timeout)
    return run_command(parser.prog, action, NotReady, status=1)


if __name__ == "__main__":
    sys.exit(main())
