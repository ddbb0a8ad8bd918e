"""A launcher run inside a manual GPU test: its output streams as it comes, under a time budget.

A slow or stuck GPU run must show where it is: every line the launcher (and the job it
submitted) prints goes to the console at once (`pytest -s` shows it live) and into the run's
log. The budget ends a run that takes too long with the launcher's own interrupt (SIGINT, as
Ctrl-C: it stops the job and releases its Ray) and fails the test naming what the run was
waiting for: its last line and how long ago it came. `interrupt_when` stops a run early the same
way once a condition holds (a checkpoint on disk, for a resume test).

A run that falls silent for `quiet_s` shows where it waits: the Python stacks of every process it
started (the launcher, Ray's workers, SGLang's schedulers), as ``py-spy dump`` reads them, go to
the console and the log, once per silence (py-spy comes with Ray's ``[default]`` extra).

A run started in the background of a non-interactive shell (`nohup ... &`, a batch script)
inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt: the launcher
would run on through its interrupt. The launcher is therefore started with SIGINT at its
default, as a terminal's foreground job is.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

GRACE_S = 90  # after SIGINT: time to stop the job and Ray before SIGKILL
QUIET_S = 150.0  # silence after which a run's stacks are shown (a fresh node's first step: 154 s)


@dataclass(frozen=True)
class Finished:
    returncode: int
    output: str
    interrupted: bool  # stopped by `interrupt_when`


class _Tail:
    """Lines as they arrive, with the time of the last one."""

    def __init__(self, log: Path) -> None:
        self.lines: list[str] = []
        self.last_at = time.monotonic()
        self.log = log.open("a", encoding="utf-8")
        self._writing = threading.Lock()

    def follow(self, stream) -> None:
        for line in stream:
            self.show(line)
            self.lines.append(line)
            self.last_at = time.monotonic()

    def show(self, text: str) -> None:
        """`text` on the console and in the log (a note of the runner's own: not in `lines`)."""
        with self._writing:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.log.write(text)
            self.log.flush()

    def waiting_for(self) -> str:
        last = next((line.strip() for line in reversed(self.lines) if line.strip()), "")
        ago = time.monotonic() - self.last_at
        return f"its last line, {ago:.0f} s ago: {last[-300:]!r}" if last else "any output"


def run_streaming(
    command: Sequence[str],
    *,
    label: str,
    budget_s: float,
    cwd: Path,
    env: dict[str, str],
    log: Path,
    interrupt_when: Callable[[], bool] | None = None,
    quiet_s: float = QUIET_S,
) -> Finished:
    """Run `command` (its output streamed and kept in `log`); fail the test when it outlasts
    `budget_s`, saying what it was waiting for; show its stacks after `quiet_s` of silence."""
    started, started_at = time.monotonic(), time.time()
    with _sigint_not_ignored():
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the interrupt reaches all of it
        )
    tail = _Tail(log)
    reader = threading.Thread(target=tail.follow, args=(process.stdout,), daemon=True)
    reader.start()
    interrupted = False
    shown_for = None  # the silence whose stacks were shown: that of the line at this time
    try:
        while process.poll() is None:
            if time.monotonic() - tail.last_at > quiet_s and shown_for != tail.last_at:
                shown_for = tail.last_at
                tail.show(
                    f"--- {label}: no output for {quiet_s:.0f} s; the stacks of its Python "
                    f"processes:\n{python_stacks(started_at)}--- end of the stacks\n"
                )
            if time.monotonic() - started > budget_s:
                waiting = tail.waiting_for()
                _stop(process)
                pytest.fail(
                    f"{label}: its time budget of {budget_s:.0f} s ran out while waiting for "
                    f"{waiting} (whole log: {log})"
                )
            if interrupt_when is not None and not interrupted and interrupt_when():
                interrupted = True
                _stop(process)
            time.sleep(1)
    finally:
        reader.join(timeout=30)
        tail.log.close()
    return Finished(process.returncode, "".join(tail.lines), interrupted)


def python_stacks(since: float) -> str:
    """``py-spy dump`` of each Python process of this user started since `since` (a
    ``time.time()``), or one line saying why there are none."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "(none: py-spy is not installed; Ray's [default] extra brings it)\n"
    dumps = []
    for pid, command in _python_processes(since):
        try:
            done = subprocess.run(
                [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
            )
            stacks = done.stdout or done.stderr
        except subprocess.TimeoutExpired:
            stacks = "(py-spy gave no stacks within 60 s)\n"
        dumps.append(f"pid {pid}: {command[:200]}\n{stacks}")
    return "".join(dumps) or "(none: no Python process of this run is left)\n"


def _python_processes(since: float) -> list[tuple[int, str]]:
    """(pid, command line) of this user's Python processes started since `since`, this one
    excepted. Start times come from ``/proc`` in whole seconds after boot: a second's slack."""
    boot = next(
        int(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    ticks = os.sysconf("SC_CLK_TCK")
    found = []
    for pid in sorted(int(name) for name in os.listdir("/proc") if name.isdigit()):
        entry = Path("/proc", str(pid))
        if pid == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            executable = Path(os.readlink(entry / "exe")).name
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        started = boot + int(fields[19]) / ticks  # field 22 of stat: start time in ticks
        if executable.startswith("python") and started >= since - 1:
            found.append((pid, command.strip()))
    return found


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """Within, SIGINT is not ignored in this process, so a child started here gets it at its
    default (an ignored signal stays ignored across exec; a handled one is reset)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(process: subprocess.Popen) -> None:
    """SIGINT to the launcher (its Ctrl-C path), SIGKILL to the group after `GRACE_S`."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def as_settings(flags: Sequence[str]) -> list[str]:
    """train.py `flags` (``--lr 1e-4 --colocate --sglang-cuda-graph-bs 1 2``) as a launcher's
    ``--set`` options (``--set lr=1e-4 --set colocate=true ...``)."""
    settings: list[str] = []
    for token in flags:
        if token.startswith("--") and not token[2:3].isdigit():
            settings += ["--set", f"{token[2:]}=true"]
        else:
            name, value = settings[-1].split("=", 1)
            settings[-1] = f"{name}={token}" if value == "true" else f"{name}={value} {token}"
    return settings
