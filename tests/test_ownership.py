"""A run acts only on what it owns: real processes, tagged or not, on this node."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness import ownership
from harness.run_tag import TAG_VAR, RunTag

LAUNCHER = "/c/launchers/amd/run_x.py"


def spawn(title: str, **env: str) -> subprocess.Popen[bytes]:
    """A sleeping process whose command line reads `title`, with `env` added."""
    return subprocess.Popen(
        ["bash", "-c", f'exec -a "{title}" sleep 600'], env={**os.environ, **env}
    )


@pytest.fixture
def spawned():
    processes: list[subprocess.Popen[bytes]] = []

    def start(title: str, **env: str) -> subprocess.Popen[bytes]:
        processes.append(spawn(title, **env))
        return processes[-1]

    yield start
    for process in processes:
        process.kill()
        process.wait()


def pids(seen: list[ownership.Seen]) -> set[int]:
    return {s.process.pid for s in seen}


def settle() -> None:
    time.sleep(0.3)  # exec -a has replaced bash


def test_run_and_slot_membership(spawned):
    run = RunTag(LAUNCHER, "2,5", "r1")
    mine = spawned("python3 train.py", **{TAG_VAR: str(run)})
    earlier = spawned("python3 train.py", **{TAG_VAR: str(RunTag(LAUNCHER, "2,5", "r0"))})
    other_devices = spawned("raylet", **{TAG_VAR: str(RunTag(LAUNCHER, "0,1", "r1"))})
    unrelated = spawned("python3 train.py --unrelated")
    settle()
    seen = ownership.processes()
    assert pids(ownership.of_run(run, seen)) == {mine.pid}
    assert pids(ownership.of_slot(run, seen)) == {mine.pid, earlier.pid}
    assert not {other_devices.pid, unrelated.pid} & pids(ownership.of_slot(run, seen))


def test_foreign_holders_of_the_requested_gpus(spawned):
    on_25 = spawned("python3 train.py --unrelated", HIP_VISIBLE_DEVICES="2,5")
    on_01 = spawned("python3 train.py --unrelated", HIP_VISIBLE_DEVICES="0,1")
    everywhere = spawned("python3 -m sglang.launch_server")
    ours = spawned("python3 train.py", **{TAG_VAR: str(RunTag(LAUNCHER, "2,5", "r0"))})
    settle()
    seen = ownership.processes()

    def holders(devices: str) -> set[int]:
        listed = ownership.foreign_holders(RunTag(LAUNCHER, devices, "r1"), seen)
        return {int(line.split()[1]) for line in listed}

    assert {on_25.pid, everywhere.pid} <= holders("2,5")
    assert not {on_01.pid, ours.pid} & holders("2,5")
    assert {on_25.pid, on_01.pid, everywhere.pid} <= holders("all")
    assert holders("cpu") == set()


def test_claim_stops_the_slot_and_nothing_else(spawned):
    run = RunTag(LAUNCHER, "cpu", "r1")
    stale = spawned("ray::IDLE", **{TAG_VAR: str(RunTag(LAUNCHER, "cpu", "r0"))})
    unrelated = spawned("python3 train.py --unrelated")
    other_launcher = spawned("raylet", **{TAG_VAR: str(RunTag("/c/x.py", "cpu", "r0"))})
    settle()
    assert ownership.claim(run, token_path=run.token_path) == 1
    assert stale.wait(timeout=5) is not None
    assert unrelated.poll() is None and other_launcher.poll() is None
    token = Path(run.token_path)
    first = token.read_text()
    assert token.stat().st_mode & 0o777 == 0o600 and len(first) == 64
    ownership.claim(run, token_path=run.token_path)
    assert token.read_text() != first, "a fresh token per run"
    assert ownership.release(run) == 0 and not os.path.exists(run.temp_dir)


def test_claim_refuses_foreign_gpu_holders_and_busy_ports(spawned):
    holder = spawned("python3 train.py --unrelated", CUDA_VISIBLE_DEVICES="3")
    settle()
    run = RunTag(LAUNCHER, "3", "r1")
    assert f"pid {holder.pid} (trainer: " in " ".join(
        ownership.foreign_holders(run, ownership.processes())
    )  # the message shows the first holders of the node; others' Rays may come first
    with pytest.raises(ownership.Refused, match=r"^GPUs 3 of this node are in use by processes"):
        ownership.claim(run)
    assert holder.poll() is None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ownership.Refused, match=f"port {port} is in use"):
            ownership.claim(RunTag(LAUNCHER, "cpu", "r1"), [port])


def test_release_stops_only_its_run(spawned):
    run = RunTag(LAUNCHER, "cpu", "r1")
    mine = spawned("raylet", **{TAG_VAR: str(run)})
    earlier = spawned("raylet", **{TAG_VAR: str(RunTag(LAUNCHER, "cpu", "r0"))})
    settle()
    assert ownership.release(run) == 1
    assert mine.wait(timeout=5) is not None and earlier.poll() is None


def test_the_command_line_refuses_in_one_line(spawned, capsys):
    holder = spawned("python3 train.py --unrelated", HIP_VISIBLE_DEVICES="7")
    settle()
    assert ownership.main(["claim", "--tag", f"{LAUNCHER}@7/r1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m harness.ownership: refused: GPUs 7 ")
    assert holder.poll() is None
