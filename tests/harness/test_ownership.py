"""A run acts only on what it owns: real processes, tagged or not, on this node."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from harness import ownership
from harness.listeners import Listener
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


@pytest.mark.parametrize(
    ("cmdline", "trainer"),
    [
        ("python3 train.py --rollout-batch-size 8", True),
        ("/usr/bin/python3.12 -u /tmp/job/train.py", True),
        ("python -m sglang.launch_server --model-path m", True),
        ("sglang::scheduler_TP0", True),
        ("/opt/venv/bin/sglang serve --model-path m", True),
        ("bash -c bash .dev/install.sh sglang .whl/sglang/batch-1 && pytest", False),
        ("vim trainer/backends/sglang/rollout.py", False),
        ("tail -f /tmp/run/sglang.log", False),
        ("python3 -m pytest tests/test_train.py", False),
        ("python3 -c import train.py", False),
        ("less train.py", False),
        ("", False),
    ],
)
def test_a_trainer_is_what_runs_not_what_is_mentioned(cmdline, trainer):
    assert ownership.runs_trainer(cmdline) is trainer


def test_a_shell_that_mentions_sglang_holds_no_gpu(spawned):
    """As seen on a GPU node: the shell that installed SGLang's wheelhouse and then ran the
    launcher's test was taken for an SGLang server on every GPU, and the claim refused."""
    shell = spawned("bash -c bash .dev/install.sh sglang .whl/sglang/batch-1 && pytest")
    server = spawned("python3 -m sglang.launch_server --model-path m")
    settle()
    listed = ownership.foreign_holders(RunTag(LAUNCHER, "all", "r1"), ownership.processes())
    holders = {int(line.split()[1]) for line in listed}
    assert server.pid in holders and shell.pid not in holders


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


NOBODY = 65534  # "another local user": this suite runs as root, so an attacker is a lesser uid


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run `argv` as another local user (uid and gid 65534, no supplementary groups)."""
    setpriv = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    return subprocess.run([*setpriv, *argv], capture_output=True, text=True, check=False)


@pytest.fixture
def fresh_run():
    """A run tag of this test's own; its private dir is removed afterwards, whoever made it."""
    run = RunTag(f"/c/launchers/test_{os.getpid()}_{time.monotonic_ns()}.py", "cpu", "r1")
    yield run
    ownership.release(run)
    shutil.rmtree(run.run_dir, ignore_errors=True)


def test_claim_refuses_a_run_dir_another_user_made_first_and_keeps_the_token_private(
    fresh_run, capsys
):
    """The attack of issue 18: another user creates the predictable run dir first, with a
    token they know, to submit jobs as the launching user. The claim refuses in one line."""
    planted = "attacker-knows-this-token"
    made = as_nobody(
        "sh", "-c", f"mkdir -m 777 {fresh_run.run_dir} && echo {planted} > {fresh_run.token_path}"
    )
    assert made.returncode == 0, made.stderr
    with pytest.raises(ownership.Refused, match=r"is not a directory of this user's \(owner uid "):
        ownership.claim(fresh_run, token_path=fresh_run.token_path)
    assert Path(fresh_run.token_path).read_text().strip() == planted, "the claim wrote into it"
    argv = ["claim", "--tag", str(fresh_run), "--token-path", fresh_run.token_path]
    assert ownership.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"refused: {fresh_run.run_dir} exists and is not" in err

    shutil.rmtree(fresh_run.run_dir)  # once it is gone, the run's own claim makes it private
    ownership.claim(fresh_run, token_path=fresh_run.token_path)
    run_dir, token = os.lstat(fresh_run.run_dir), os.lstat(fresh_run.token_path)
    assert (run_dir.st_uid, stat.S_IMODE(run_dir.st_mode)) == (os.geteuid(), 0o700)
    assert (token.st_uid, stat.S_IMODE(token.st_mode)) == (os.geteuid(), 0o600)
    assert Path(fresh_run.temp_dir).parent == Path(fresh_run.run_dir), "Ray's dir is inside"
    stolen = as_nobody("sh", "-c", f"cat {fresh_run.token_path}; ls {fresh_run.run_dir}")
    swapped = as_nobody("sh", "-c", f"echo {planted} > {fresh_run.token_path}")
    assert stolen.returncode and swapped.returncode and "Permission denied" in swapped.stderr
    assert Path(fresh_run.token_path).read_text() != planted


def test_a_dead_runs_own_leftover_dir_is_replaced_by_a_fresh_private_one(fresh_run):
    os.makedirs(fresh_run.temp_dir)
    os.chmod(fresh_run.run_dir, 0o777)  # as main's `ray start` left it
    Path(fresh_run.run_dir, "planted").write_text("x")
    ownership.claim(fresh_run, token_path=fresh_run.token_path)
    assert sorted(os.listdir(fresh_run.run_dir)) == ["auth_token", "run.json"]
    assert stat.S_IMODE(os.lstat(fresh_run.run_dir).st_mode) == 0o700


def test_the_multi_node_token_dir_is_private_or_refused(fresh_run, tmp_path):
    token = tmp_path / "outputs" / "r1" / "ray" / "auth_token"
    token.parent.mkdir(parents=True)
    os.chown(token.parent, NOBODY, NOBODY)  # another user's, on the shared output dir
    with pytest.raises(ownership.Refused, match="is not a directory of this user's"):
        ownership.claim(fresh_run, token_path=str(token))
    assert not os.path.exists(fresh_run.run_dir), "refused before anything was made"
    os.chown(token.parent, os.geteuid(), os.getegid())
    os.chmod(token.parent, 0o755)
    with pytest.raises(ownership.Refused, match=r"has mode 755: others may have read"):
        ownership.claim(fresh_run, token_path=str(token))
    os.chmod(token.parent, 0o700)
    os.chmod(token.parent.parent, 0o777)  # others may swap the `ray` dir for their own
    with pytest.raises(ownership.Refused, match=r"r1 may be changed by other users \(mode 777\)"):
        ownership.claim(fresh_run, token_path=str(token))
    os.chmod(token.parent.parent, 0o755)

    ownership.claim(fresh_run, token_path=str(token))
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    from harness.cluster import wait_head

    with socket.socket() as head:  # the worker's side: the head answers, its token is private
        head.bind(("127.0.0.1", 0))
        head.listen()
        address = f"127.0.0.1:{head.getsockname()[1]}"
        wait_head(address, str(token), timeout_s=5)
        os.chmod(token, 0o644)
        from harness.cluster import NotReady

        with pytest.raises(NotReady, match=r"refused the head's token: .* not private"):
            wait_head(address, str(token), timeout_s=5)


def test_the_multi_node_token_is_removed_with_the_run(fresh_run, tmp_path):
    token = tmp_path / "outputs" / "r1" / "ray" / "auth_token"
    ownership.claim(fresh_run, token_path=str(token))
    assert token.stat().st_size == 64
    ownership.release(fresh_run)
    assert not token.exists(), "the run's token outlives it"


def test_a_run_in_progress_is_refused_by_name_and_left_alone(spawned, fresh_run):
    """Run B of the same launcher on the same devices does not stop run A: it refuses, naming
    A, while A's launcher lives; once A's launcher is dead, its leftovers are B's to clean."""
    running = fresh_run
    launcher = spawned("python3 -m launchers.x train --run-id r1")  # run A's launcher
    settle()
    ownership.claim(running, owner=launcher.pid)
    ray = spawned("raylet", **{TAG_VAR: str(running)})
    second = RunTag(running.launcher, "cpu", "r2")
    settle()
    try:
        with pytest.raises(ownership.Refused) as refusal:
            ownership.claim(second)
        message = str(refusal.value)
        assert message.startswith(f"run 'r1' (launcher pid {launcher.pid}) of this launcher on ")
        assert "is in progress" in message and "\n" not in message
        with pytest.raises(ownership.Refused, match="is in progress"):
            ownership.claim(running)  # the same run id twice
        assert ray.poll() is None and os.path.isdir(running.run_dir), "run A was touched"
        assert not os.path.exists(second.run_dir)
    finally:
        launcher.kill()
        launcher.wait()
    try:
        assert ownership.claim(second) == 1, "a dead run's leftovers are cleaned"
        assert ray.wait(timeout=15) is not None and not os.path.exists(running.run_dir)
    finally:
        ownership.release(second)


def test_release_and_claim_stop_only_the_runs_ray_and_trainer_processes(fresh_run):
    """A ``tail -f`` of a run's Ray log or a shell in its logs dir is not the run's; a Ray
    process whose title hid its tag, with a log of the run open, is."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        processes.append(subprocess.Popen(argv, cwd=cwd))
        return processes[-1]

    def run_files() -> Path:
        logs = Path(fresh_run.temp_dir) / "session_x" / "logs"
        logs.mkdir(parents=True)
        (logs / "raylet.out").write_text("")
        return logs

    def ray_worker(logs: Path) -> subprocess.Popen[bytes]:
        return start(
            ["bash", "-c", f'exec -a "python default_worker.py" tail -f {logs}/raylet.out']
        )

    try:
        ownership.claim(fresh_run)
        logs = run_files()
        tail, shell = start(["tail", "-f", str(logs / "raylet.out")]), start(["sleep", "600"], logs)
        ray = ray_worker(logs)
        settle()
        assert ownership.claim(fresh_run) == 1  # a rerun after a crash: the Ray, nothing else
        assert ray.wait(timeout=15) is not None
        assert tail.poll() is None and shell.poll() is None
        logs = run_files()
        tail, shell = start(["tail", "-f", str(logs / "raylet.out")]), start(["sleep", "600"], logs)
        ray = ray_worker(logs)
        settle()
        assert ownership.release(fresh_run) == 1
        assert ray.wait(timeout=15) is not None
        assert tail.poll() is None and shell.poll() is None
    finally:
        for process in processes:
            process.kill()
            process.wait()


def readings(*found: tuple[ownership.Held, list[int]]):
    """A `verify` reader that returns `found` one reading at a time."""
    queue = list(found)

    def read(tag: RunTag, ports) -> tuple[ownership.Held, list[int]]:
        return queue.pop(0)

    return read


UNKNOWN = Listener(6379, "::ffff:127.0.0.1", None)


def test_a_listener_bound_while_a_reading_walked_the_processes_is_read_again_not_refused():
    """psutil maps sockets to processes before it reads the kernel's socket table: a socket
    the run's Ray binds between the two shows without its process once."""
    tag = RunTag(LAUNCHER, "0", "e2e")
    read = readings(({(6379, UNKNOWN.address): UNKNOWN}, []), ({}, []))
    ownership.verify(tag, [6379], timeout_s=5, poll_s=0, read=read)


def test_a_listener_foreign_in_two_readings_in_a_row_is_refused():
    tag = RunTag(LAUNCHER, "0", "e2e")
    held = {(6379, UNKNOWN.address): UNKNOWN}
    read = readings(({}, [6379]), (held, []), (held, []))
    with pytest.raises(ownership.Refused, match=re.escape("another user on ::ffff:127.0.0.1:6379")):
        ownership.verify(tag, [6379], timeout_s=5, poll_s=0, read=read)
