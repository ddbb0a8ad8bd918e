"""What a run owns on this node, and acting only on that.

A launcher's run is recognised among this user's processes by its tag (`harness.run_tag`) in a
process's environment or, for a Ray or trainer process, by a file it holds open in the run's
private dir (Ray's process titles may overwrite the environment block, and every Ray process
logs there); a ``tail -f`` of a run's log or a shell in its logs dir is not the run's.

`claim` prepares a run. Before touching anything it refuses, in one line, when a run of the same
launcher on the same devices is in progress (its launcher process lives), when the run's
private dir is not this user's, when a Ray, trainer or SGLang that this launcher did not start
holds the requested devices, or a requested port is taken. Then it stops what *dead* runs of
the same launcher on the same devices left behind, creates the run's private dir (mode 0700,
by this claim) with the run's record, and writes the run's fresh Ray token. A live launcher
claims under `slot_lock`, which it holds to its end, so two launches at the same moment cannot
both pass. `verify`, after ``ray start``, makes sure that the run's own Ray, and nothing else,
listens on its ports before anything sends them the token. `release` stops the run's
processes and removes its private dir and token, and nothing else.

    python -m harness.ownership claim --tag TAG [--port PORT ...] [--token-path PATH]
    python -m harness.ownership verify --tag TAG [--port PORT ...] [--timeout SECONDS]
    python -m harness.ownership release --tag TAG

From the command line the run's launcher is the claim's parent process (the shell running the
steps); in live mode it is the launcher itself.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial

import psutil

from common.command_line import run_command
from harness.gpu_processes import GpuMap, gpu_processes
from harness.listeners import Listener, listeners
from harness.locks import Locked, exclusive_lock
from harness.private_files import (
    NotPrivate,
    check_parents,
    check_private_dir,
    make_private_dir,
    own_dir_mode,
    private_dir,
    write_secret,
)
from harness.run_tag import JOB_ENV_FILE, TAG_VAR, TEMP_ROOT, RunTag

_GRACE_S = 5.0  # then SIGKILL: the GCS and raylet may not end on SIGTERM at all
_INTERPRETER = re.compile(r"python[\d.]*")
_VISIBILITY = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class Refused(Exception):
    """The run cannot start here without touching what is not its own (one line)."""


RECORD = "run.json"  # in a run's private dir: its tag, its launcher process, its token


@dataclass(frozen=True)
class Seen:
    """One process as ownership sees it; `environ` is None when it cannot be read."""

    process: psutil.Process
    name: str
    cmdline: str
    environ: dict[str, str] | None
    paths: tuple[str, ...]
    uid: int | None = None

    def tagged(self, accept: Callable[[str], bool], dir_prefix: str) -> bool:
        """This user's, and tagged so that `accept` takes the tag, or a Ray or trainer process
        with a file (or its cwd) under `dir_prefix`."""
        if self.uid != os.geteuid():
            return False
        tag = (self.environ or {}).get(TAG_VAR)
        if tag is not None and accept(tag):
            return True
        return self.kind is not None and any(path.startswith(dir_prefix) for path in self.paths)

    @property
    def kind(self) -> str | None:
        """``Ray``, ``trainer`` or None: what could hold GPUs for a training run."""
        from ray.autoscaler._private.constants import RAY_PROCESSES

        for keyword, by_name in RAY_PROCESSES:
            if keyword in (self.name if by_name else self.cmdline):
                return "Ray"
        return "trainer" if runs_trainer(self.cmdline) else None

    def devices(self, on_gpus: Callable[[], GpuMap | None]) -> frozenset[str] | None:
        """The GPU ids it may use: its visibility variable; else, when its environment cannot
        be read, those the GPU tool (`on_gpus`) says it holds; else (no tool answers, or no
        variable) all."""
        if self.environ is None:
            held = on_gpus()
            return None if held is None else held.get(self.process.pid, frozenset())
        for name in _VISIBILITY:
            if name in self.environ:
                return frozenset(d.strip() for d in self.environ[name].split(",") if d.strip())
        return None


def runs_trainer(cmdline: str) -> bool:
    """Whether a command line runs a trainer or an SGLang server: a Python interpreter running
    a ``train.py`` script or an ``sglang`` module, SGLang's console script, or one of SGLang's
    own processes (titled ``sglang::...``).

    What a command merely mentions does not count: a shell installing ``.whl/sglang/batch-1``,
    an editor on ``train.py`` or a ``tail -f`` of an SGLang log holds no GPU.
    """
    words = cmdline.split()
    if not words:
        return False
    program = os.path.basename(words[0])
    if words[0].startswith("sglang::") or program == "sglang":
        return True
    if not _INTERPRETER.fullmatch(program):
        return False
    arguments = iter(words[1:])
    for word in arguments:
        if word == "-c":
            return False
        if word == "-m":
            return next(arguments, "").split(".")[0] == "sglang"
        if not word.startswith("-"):
            return os.path.basename(word) == "train.py"
    return False


def processes() -> list[Seen]:
    """Every other process of this node, with what ownership needs to know of it."""
    seen = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            name, cmdline = process.name(), " ".join(process.cmdline())
            uid = process.uids().effective
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
        seen.append(Seen(process, name, cmdline, environ, paths, uid))
    return seen


def of_run(tag: RunTag, seen: Sequence[Seen]) -> list[Seen]:
    """The processes of run `tag`."""
    return [s for s in seen if s.tagged(lambda t: t == str(tag), tag.run_dir + "/")]


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


def foreign_holders(
    tag: RunTag, seen: Sequence[Seen], on_gpus: Callable[[], GpuMap | None] = gpu_processes
) -> list[str]:
    """Rays, trainers and SGLang servers not of `tag`'s slot whose devices overlap its own.

    `on_gpus` (asked once, and only for a process whose environment cannot be read) tells
    which devices each process holds.
    """
    wanted = tag.device_ids
    if wanted == frozenset():
        return []
    ours = {s.process.pid for s in of_slot(tag, seen)}
    answers: list[GpuMap | None] = []

    def held() -> GpuMap | None:
        if not answers:
            answers.append(on_gpus())
        return answers[0]

    holders = []
    for s in seen:
        if s.process.pid in ours or (kind := s.kind) is None:
            continue
        theirs = s.devices(held)
        if theirs == frozenset():
            continue
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


@dataclass(frozen=True)
class RunRecord:
    """What a run's private dir says of it: its tag, the launcher process that runs it (pid
    and start time, so a reused pid is not mistaken for it), and a token kept elsewhere."""

    tag: str
    pid: int
    started: float
    token_path: str | None = None

    @classmethod
    def of(cls, tag: RunTag, owner: int, token_path: str | None) -> RunRecord:
        elsewhere = None if token_path in (None, tag.token_path) else token_path
        return cls(str(tag), owner, psutil.Process(owner).create_time(), elsewhere)

    @classmethod
    def read(cls, run_dir: str) -> RunRecord | None:
        """The record in `run_dir`, a directory of this user's; None without a readable one."""
        try:
            info = os.lstat(run_dir)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                return None
            with open(os.path.join(run_dir, RECORD)) as file:
                return cls(**json.load(file))
        except (OSError, ValueError, TypeError):
            return None

    @property
    def in_progress(self) -> bool:
        """The run's launcher still runs."""
        try:
            return psutil.Process(self.pid).create_time() == self.started
        except psutil.Error:
            return False

    def describe(self) -> str:
        return f"run {RunTag.parse(self.tag).run_id!r} (launcher pid {self.pid})"


def claim(
    tag: RunTag,
    ports: Sequence[int] = (),
    token_path: str | None = None,
    owner: int | None = None,
) -> int:
    """Make this node ready for run `tag` of launcher process `owner` (default: this one),
    with a fresh Ray token in `token_path`, if given; the number of dead runs' processes
    stopped.

    Raises `Refused` when a run of this launcher on these devices is in progress, when the
    run's private dir or the token's dir is not this user's, when a process this launcher did
    not start holds the requested devices, or a requested port is taken.
    """
    owner = os.getpid() if owner is None else owner
    record = RunRecord.of(tag, owner, token_path)
    leftovers = []
    for run_dir in sorted(glob.glob(glob.escape(tag.slot_prefix) + "*")):
        found = RunRecord.read(run_dir)
        if found is not None and found.in_progress and found.pid != owner:
            raise Refused(
                f"{found.describe()} of this launcher on {tag.devices} is in progress; wait "
                f"for it to end, or stop it (Ctrl-C in its terminal, or kill {found.pid})"
            )
        if _own_dir(run_dir):
            leftovers.append(run_dir)
    try:  # before anything is stopped: a path another user prepared is refused
        check_parents(TEMP_ROOT)
        own_dir_mode(tag.run_dir)
        if record.token_path is not None:
            check_private_dir(os.path.dirname(record.token_path))
    except NotPrivate as err:
        raise Refused(str(err)) from None
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
            "start (another Ray?); choose free ones with --ray-port / --dashboard-port / "
            "--agent-port / --client-server-port"
        )
    for run_dir in leftovers:
        remove_run_files(run_dir)
    try:
        make_private_dir(tag.run_dir)
        write_secret(os.path.join(tag.run_dir, RECORD), json.dumps(asdict(record)))
        if record.token_path is not None:
            private_dir(os.path.dirname(record.token_path))
        if token_path is not None:
            write_secret(token_path, secrets.token_hex(32))  # 256 bits, as Ray's own generator
    except NotPrivate as err:
        raise Refused(str(err)) from None
    return stopped


Held = dict[tuple[int, str], Listener]


def foreign_listeners(tag: RunTag, ports: Sequence[int]) -> tuple[Held, list[int]]:
    """One reading of `ports`: the listeners that are not run `tag`'s processes, by port and
    address, and the ports nobody listens on."""
    ours = {s.process.pid for s in of_run(tag, processes())}
    held = listeners(ports)
    foreign = {
        (lis.port, lis.address): lis
        for found in held.values()
        for lis in found
        if lis.pid not in ours
    }
    return foreign, [port for port, found in held.items() if not found]


def verify(
    tag: RunTag,
    ports: Sequence[int],
    timeout_s: float,
    poll_s: float = 0.5,
    read: Callable[[RunTag, Sequence[int]], tuple[Held, list[int]]] = foreign_listeners,
) -> None:
    """Return once run `tag`'s own processes listen on each of `ports` and nothing else does;
    raise `Refused` as soon as another process listens on one, or when one is still free
    after `timeout_s` (the run's Ray half started).

    A listener is foreign only when two readings in a row say so: a socket that the run's Ray
    binds while a reading walks the processes shows without its process (or with one that
    started after the walk), and the next reading, begun after the bind, sees whose it is."""
    deadline = time.monotonic() + timeout_s
    suspects: Held = {}
    while True:
        foreign, free = read(tag, ports)
        if confirmed := [lis for key, lis in foreign.items() if key in suspects]:
            raise Refused(_taken(confirmed))
        suspects = foreign
        if not foreign and not free:
            return
        if time.monotonic() > deadline:
            raise Refused(
                _taken(foreign.values())
                if foreign
                else f"this run's Ray did not start listening on port "
                f"{', '.join(map(str, free))} within {timeout_s:g} s: it half started (its "
                f"logs: {tag.temp_dir}/session_latest/logs)"
            )
        if not foreign:
            time.sleep(poll_s)


def _taken(foreign: Iterable[Listener]) -> str:
    return (
        f"{'; '.join(lis.describe() for lis in foreign)}: not this run's Ray, which must hold "
        "that port before it is sent the run's token (another process took it after the "
        "claim); stop that process or choose another port"
    )


@contextlib.contextmanager
def slot_lock(tag: RunTag) -> Iterator[None]:
    """Held by a live launcher from before its claim to its end: a second launch of this
    launcher on these devices, even at the same moment, is refused by name instead of
    racing the first through the claim."""
    check_parents(TEMP_ROOT)
    held = contextlib.ExitStack()
    try:
        held.enter_context(exclusive_lock(tag.lock_path, f"run {tag.run_id!r}"))
    except Locked as holder:
        raise Refused(
            f"{holder} of this launcher on {tag.devices} is starting or in progress; wait for "
            "it to end, or stop it"
        ) from None
    except NotPrivate as err:
        raise Refused(str(err)) from None
    with held:
        yield


def release(tag: RunTag) -> int:
    """Stop every process of run `tag`, remove its private dir and a token it keeps elsewhere;
    the number stopped."""
    stopped = stop(of_run(tag, processes()))
    remove_run_files(tag.run_dir)
    return stopped


def remove_run_files(run_dir: str) -> None:
    """Remove `run_dir` when it is this user's, and the token its record names elsewhere (with
    what the job left beside it, `JOB_ENV_FILE`, and its dir when that is then empty)."""
    record = RunRecord.read(run_dir)
    if record is not None and record.token_path is not None:
        token_dir = os.path.dirname(record.token_path)
        for path in (record.token_path, os.path.join(token_dir, JOB_ENV_FILE)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(token_dir)
    if _own_dir(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)


def _own_dir(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.ownership", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    claim_parser = commands.add_parser("claim", help="clean up the slot, refuse foreign holders")
    claim_parser.add_argument("--tag", type=RunTag.parse, required=True)
    claim_parser.add_argument("--port", type=int, action="append", default=[])
    claim_parser.add_argument("--token-path", help="write a fresh Ray token there")
    release_parser = commands.add_parser("release", help="stop this run's processes")
    release_parser.add_argument("--tag", type=RunTag.parse, required=True)
    verify_parser = commands.add_parser("verify", help="the run's Ray, alone, holds the ports")
    verify_parser.add_argument("--tag", type=RunTag.parse, required=True)
    verify_parser.add_argument("--port", type=int, action="append", default=[])
    verify_parser.add_argument("--timeout", type=float, default=30.0)
    options = parser.parse_args(argv)
    if options.command == "claim":
        action = partial(claim, options.tag, options.port, options.token_path, owner=os.getppid())
    elif options.command == "verify":
        action = partial(verify, options.tag, options.port, options.timeout)
    else:
        action = partial(release, options.tag)
    return run_command(parser.prog, action, Refused, status=1, label="refused")


if __name__ == "__main__":
    sys.exit(main())
