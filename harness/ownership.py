"""What a run owns on this node, and acting only on that.

A launcher's run is recognised by its tag (`harness.run_tag`): in a process's environment, or
by a file the process holds open in the run's temp dir (Ray's process titles may overwrite the
environment block, and every Ray process logs into the temp dir). `claim` prepares a run:
it stops what an earlier run of the same launcher on the same devices left behind, refuses in
one line when a Ray, trainer or SGLang that this launcher did not start holds the requested
devices or ports, and writes the run's fresh Ray authentication token.
`release` stops the run's processes and no other.

    python -m harness.ownership claim --tag TAG [--port PORT ...] [--token-path PATH]
    python -m harness.ownership release --tag TAG
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil

from harness.run_tag import TAG_VAR, RunTag

_GRACE_S = 10.0
_TRAINER = re.compile(r"(^|[\s/])train\.py(\s|$)|sglang")
_VISIBILITY = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class Refused(Exception):
    """The run cannot start here without touching what is not its own (one line)."""


@dataclass(frozen=True)
class Seen:
    """One process as ownership sees it; `environ` is None when it cannot be read."""

    process: psutil.Process
    name: str
    cmdline: str
    environ: dict[str, str] | None
    paths: tuple[str, ...]

    def tagged(self, accept: Callable[[str], bool], dir_prefix: str) -> bool:
        tag = (self.environ or {}).get(TAG_VAR)
        return (tag is not None and accept(tag)) or any(
            path.startswith(dir_prefix) for path in self.paths
        )

    @property
    def kind(self) -> str | None:
        """``Ray``, ``trainer`` or None: what could hold GPUs for a training run."""
        from ray.autoscaler._private.constants import RAY_PROCESSES

        for keyword, by_name in RAY_PROCESSES:
            if keyword in (self.name if by_name else self.cmdline):
                return "Ray"
        return "trainer" if _TRAINER.search(self.cmdline) else None

    @property
    def devices(self) -> frozenset[str] | None:
        """The GPU ids it may use: its visibility variable, else (or unreadable) all."""
        for name in _VISIBILITY:
            if self.environ is not None and name in self.environ:
                return frozenset(d.strip() for d in self.environ[name].split(",") if d.strip())
        return None


def processes() -> list[Seen]:
    """Every other process of this node, with what ownership needs to know of it."""
    seen = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            name, cmdline = process.name(), " ".join(process.cmdline())
        except psutil.Error:
            continue
        try:
            environ: dict[str, str] | None = process.environ()
        except psutil.Error:
            environ = None
        try:
            paths = (*(f.path for f in process.open_files()), process.cwd())
        except psutil.Error:
            paths = ()
        seen.append(Seen(process, name, cmdline, environ, paths))
    return seen


def of_run(tag: RunTag, seen: Sequence[Seen]) -> list[Seen]:
    """The processes of run `tag`."""
    return [s for s in seen if s.tagged(lambda t: t == str(tag), tag.temp_dir + "/")]


def of_slot(tag: RunTag, seen: Sequence[Seen]) -> list[Seen]:
    """The processes of any run of `tag`'s launcher on `tag`'s devices."""
    return [s for s in seen if s.tagged(lambda t: t.startswith(tag.slot + "/"), tag.slot_prefix)]


def stop(victims: Sequence[Seen], grace_s: float = _GRACE_S) -> int:
    """SIGTERM `victims`, SIGKILL what is left after `grace_s`; the number stopped."""
    procs = []
    for seen in victims:
        try:
            seen.process.terminate()
            procs.append(seen.process)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def foreign_holders(tag: RunTag, seen: Sequence[Seen]) -> list[str]:
    """Rays, trainers and SGLang servers not of `tag`'s slot whose devices overlap its own."""
    wanted = tag.device_ids
    if wanted == frozenset():
        return []
    ours = {s.process.pid for s in of_slot(tag, seen)}
    holders = []
    for s in seen:
        if s.process.pid in ours or (kind := s.kind) is None:
            continue
        theirs = s.devices
        if wanted is None or theirs is None or wanted & theirs:
            holders.append(f"pid {s.process.pid} ({kind}: {s.cmdline[:60]})")
    return holders


def busy_ports(ports: Sequence[int]) -> list[int]:
    """The `ports` something on this node already listens on."""
    busy = []
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError:
                busy.append(port)
    return busy


def claim(tag: RunTag, ports: Sequence[int] = (), token_path: str | None = None) -> int:
    """Make this node ready for run `tag` (with a fresh Ray token in `token_path`, if given);
    the number of an earlier run's processes stopped.

    Raises `Refused` when a process this launcher did not start holds the requested devices,
    or a requested port is taken.
    """
    stopped = stop(of_slot(tag, processes()))
    if holders := foreign_holders(tag, processes()):
        shown = "all GPUs" if tag.device_ids is None else f"GPUs {tag.devices}"
        raise Refused(
            f"{shown} of this node are in use by processes this launcher did not start: "
            f"{'; '.join(holders[:3])}{' ...' if len(holders) > 3 else ''}; stop them or "
            "choose other devices (HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES)"
        )
    if busy := busy_ports(ports):
        raise Refused(
            f"port {', '.join(map(str, busy))} is in use by a process this launcher did not "
            "start (another Ray?); choose free ones with --ray-port / --dashboard-port"
        )
    if token_path is not None:
        os.makedirs(os.path.dirname(token_path), mode=0o700, exist_ok=True)
        write_token(token_path)
    return stopped


def write_token(path: str) -> None:
    """A fresh Ray authentication token (256 bits, as Ray's own generator) in `path`, mode 0600."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))


def release(tag: RunTag) -> int:
    """Stop every process of run `tag` and remove its temp dir; the number stopped."""
    stopped = stop(of_run(tag, processes()))
    shutil.rmtree(tag.temp_dir, ignore_errors=True)
    return stopped


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.ownership", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    claim_parser = commands.add_parser("claim", help="clean up the slot, refuse foreign holders")
    claim_parser.add_argument("--tag", type=RunTag.parse, required=True)
    claim_parser.add_argument("--port", type=int, action="append", default=[])
    claim_parser.add_argument("--token-path", help="write a fresh Ray token there")
    release_parser = commands.add_parser("release", help="stop this run's processes")
    release_parser.add_argument("--tag", type=RunTag.parse, required=True)
    options = parser.parse_args(argv)
    try:
        if options.command == "claim":
            claim(options.tag, options.port, options.token_path)
        else:
            release(options.tag)
    except Refused as err:
        print(f"{parser.prog}: refused: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
