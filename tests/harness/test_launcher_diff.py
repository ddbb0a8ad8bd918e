"""The launcher diff on a throwaway git repository holding a copy of this checkout."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.diff import Change, diff_recordings, format_markdown, split_command, step_view

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = "launchers/cpu/run_tiny_qwen3_lora.py"
GIT_ID = ("-c", "user.name=diff test", "-c", "user.email=diff@test")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *GIT_ID, "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository whose HEAD is this checkout's code (what recording needs)."""
    listed = _git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard").splitlines()
    for name in listed:
        if (
            name.startswith(("common/", "harness/", "launchers/", "trainer/"))
            and (ROOT / name).is_file()
        ):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tmp_path / name)
    _git(tmp_path, "init", "--quiet")
    _git(tmp_path, "add", "--all")
    _git(tmp_path, "commit", "--quiet", "--message", "base")
    return tmp_path


def _diff(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "harness.diff", *args],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _quadruple_lora_rank(repo: Path) -> tuple[int, int]:
    path = repo / LAUNCHER
    source = path.read_text()
    match = re.search(r"lora_rank=(\d+)", source)
    assert match, f"{LAUNCHER} no longer sets lora_rank"
    old = int(match[1])
    path.write_text(source.replace(match[0], f"lora_rank={old * 4}", 1))
    return old, old * 4


def _worktrees(repo: Path) -> list[str]:
    return [line for line in _git(repo, "worktree", "list").splitlines() if line]


def test_no_change_exits_0(repo: Path) -> None:
    done = _diff(repo, "--base", "HEAD")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "No launcher changes against HEAD.\n",
        "",
    )
    assert len(_worktrees(repo)) == 1


# (recording, step) of every train.py a launcher runs or writes a manifest of
JOBS = [
    *((name, "ray_job_submit") for name in ("train", "full_train", "train_2_nodes")),
    *((name, "rayjob") for name in ("rayjob", "rayjob_2_nodes")),
]


def test_one_lora_default_is_exactly_one_flag_change(repo: Path) -> None:
    old, new = _quadruple_lora_rank(repo)
    text = _diff(repo, "--base", "HEAD")
    markdown = _diff(repo, "--base", "HEAD", "--format", "markdown")

    assert text.returncode == 1, text.stderr
    assert text.stdout == (
        "Launcher changes against HEAD:\n"
        + "".join(
            f"{LAUNCHER} {entrypoint}:\n"
            f"  {step} python3 train.py:\n"
            f"    flag changed: --lora-rank: {old} -> {new}\n"
            for entrypoint, step in JOBS
        )
    )

    assert markdown.returncode == 1, markdown.stderr
    rows = [line for line in markdown.stdout.splitlines() if line.startswith("| `")]
    assert rows == [
        f"| `{step} python3 train.py` | flag changed | `--lora-rank` | `{old}` | `{new}` |"
        for _, step in JOBS
    ]
    assert f"**`{LAUNCHER}` · `train`**" in markdown.stdout
    assert len(_worktrees(repo)) == 1


def test_unknown_revision_is_one_line_and_exit_2(repo: Path) -> None:
    done = _diff(repo, "--base", "no-such-rev")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == "python -m harness.diff: error: unknown revision 'no-such-rev'\n"


def test_worktree_is_removed_when_the_base_cannot_record(repo: Path) -> None:
    (repo / LAUNCHER).write_text((repo / LAUNCHER).read_text() + "\nraise SystemExit('broken')\n")
    _git(repo, "commit", "--quiet", "--all", "--message", "broken launcher")
    _git(repo, "checkout", "--quiet", "HEAD~1", "--", LAUNCHER)
    done = _diff(repo, "--base", "HEAD")
    assert done.returncode == 2
    assert done.stderr == "python -m harness.diff: error: cannot record HEAD: broken\n"
    assert len(_worktrees(repo)) == 1


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stopped_diff_removes_its_worktree_and_its_recording(
    repo: Path, tmp_path: Path, signum: int
) -> None:
    """The base records slowly (its harness/record.py waits); the diff is stopped meanwhile."""
    record = repo / "harness" / "record.py"
    real = record.read_text()
    pid_file = tmp_path / "recording.pid"
    record.write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    _git(repo, "commit", "--quiet", "--all", "--message", "a base that records slowly")
    record.write_text(real)
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1"}
    diff = subprocess.Popen(
        [sys.executable, "-m", "harness.diff", "--base", "HEAD"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert diff.poll() is None, diff.communicate()
            assert time.monotonic() < deadline, "the base never started recording"
            time.sleep(0.05)
        (_, base_line) = _worktrees(repo)
        base = Path(base_line.split()[0])
        assert base.is_dir()
        diff.send_signal(signum)
        out, err = diff.communicate(timeout=60)
    finally:
        diff.kill()
    assert diff.returncode == 128 + signum, err
    name = signal.Signals(signum).name
    assert (out, err) == ("", f"python -m harness.diff: error: stopped by {name}\n")
    assert len(_worktrees(repo)) == 1, "the base worktree is still registered"
    assert not base.exists() and not base.parent.exists(), "the base worktree is left on disk"
    assert not psutil.pid_exists(int(pid_file.read_text())), "the base's recording runs on"


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("raise RuntimeError('half-edited')", "half-edited"),
        ("raise SystemExit('broken')", "broken"),
        ("LAUNCHER = None", "launchers/cpu/run_tiny_qwen3_lora.py declares no LAUNCHER"),
    ],
)
def test_a_working_tree_that_cannot_record_exits_2(repo: Path, breakage: str, reason: str) -> None:
    (repo / LAUNCHER).write_text((repo / LAUNCHER).read_text() + f"\n{breakage}\n")
    done = _diff(repo, "--base", "HEAD")
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("python -m harness.diff: error: cannot record the working tree: ")
    assert reason in done.stderr and done.stderr.count("\n") == 1


def test_split_command_keeps_values_and_switches() -> None:
    argv = ["python3", "train.py", "--colocate", "--rollout-top-k", "-1"]
    command, flags = split_command([*argv, "--eval-prompt-data", "aime24", "/data/aime 24.jsonl"])
    assert command == "python3 train.py"
    assert flags == (
        ("--colocate", None),
        ("--rollout-top-k", "-1"),
        ("--eval-prompt-data", "aime24 '/data/aime 24.jsonl'"),
    )
    assert split_command(["python3", "-m", "trainer.tiny", "--seed", "0"]) == (
        "python3 -m trainer.tiny",
        (("--seed", "0"),),
    )


def test_step_view_separates_flags_env_and_settings() -> None:
    view = step_view(
        {
            "kind": "ray_job_submit",
            "address": "http://127.0.0.1:8265",
            "entrypoint": ["python3", "train.py", "--lora-rank", "64"],
            "runtime_env": {"env_vars": {"NCCL_NVLS_ENABLE": "0"}, "working_dir": "/w"},
        }
    )
    assert view.label == "ray_job_submit python3 train.py"
    assert view.flags == (("--lora-rank", "64"),)
    assert view.env == {"NCCL_NVLS_ENABLE": "0"}
    assert view.settings == {"address": "http://127.0.0.1:8265", "runtime_env.working_dir": "/w"}


def _recording(launcher: str, entrypoint: str, hardware: str, steps: list[dict]) -> dict:
    return {"launcher": launcher, "entrypoint": entrypoint, "hardware": hardware, "steps": steps}


def test_steps_env_hardware_order_and_launchers() -> None:
    job = "ray_job_submit python3 train.py"
    ray = {"kind": "ray_start", "head": True, "env": {"A": "1", "B": "2"}}
    submit = {"kind": "ray_job_submit", "entrypoint": ["python3", "train.py", "--x", "1", "--y"]}
    download = {"kind": "hub_download", "repo_id": "org/data", "local_dir": "/d"}
    base = [
        _recording("launchers/a", "train", "MI355X", [download, ray, submit]),
        _recording("launchers/gone", "train", "CPU", [ray]),
    ]
    reordered = {**submit, "entrypoint": ["python3", "train.py", "--y", "--x", "1"]}
    head = [
        _recording("launchers/a", "train", "MI350X", [{**ray, "env": {"A": "0"}}, reordered]),
        _recording("launchers/new", "prepare", "CPU", [download]),
    ]
    diffs = diff_recordings(base, head)
    assert [(d.launcher, d.status) for d in diffs] == [
        ("launchers/a", "changed"),
        ("launchers/gone", "removed"),
        ("launchers/new", "added"),
    ]
    assert diffs[0].changes == {
        "train": [
            Change("hardware", "changed", "hardware", "MI355X", "MI350X"),
            Change("step", "removed", "hub_download org/data"),
            Change("env", "changed", "A", "1", "0", "ray_start head"),
            Change("env", "removed", "B", old="2", step="ray_start head"),
            Change("flags", "reordered", "order of the common flags", step=job),
        ]
    }
    markdown = format_markdown(diffs, "main")
    assert "- launcher removed: `launchers/gone.py` (train)" in markdown
    assert "| `ray_start head` | env changed | `A` | `1` | `0` |" in markdown
