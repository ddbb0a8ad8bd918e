"""Files a run writes at predictable paths never follow a symlink planted there, and a
directory another user can change is refused (`owned_files`).

Each case plants a symlink to a victim file (or directory) where the run writes, lets the run
write, and checks the victim is untouched; where following the link cannot be avoided the run
stops with one line instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from common import owned_files
from trainer.arguments import parse_args
from trainer.run import adapter_check, checkpoint
from trainer.run.metrics import METRICS_FILE, MetricsError, MetricsLogger, write_summary

VICTIM = "someone else's data\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim"
    path.write_text(VICTIM)
    return path


def plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def trainer_save(path: Path) -> None:
    from safetensors.torch import save_file

    (path / "adapter").mkdir()
    save_file({"w": torch.zeros(2)}, str(path / "adapter" / "adapter_model.safetensors"))
    check = adapter_check.LogprobCheck([1, 2], [True], [-0.5], 1.0)
    adapter_check.write(path / "adapter", check)


def save(root: Path, iteration: int = 2) -> None:
    checkpoint.save(root, iteration, trainer_save, {"rollout_index": iteration, "data": {}})


def metrics_appended(out: Path) -> None:
    MetricsLogger(out, total_steps=2).log(0, {"x": 1.0})


def metrics_rewritten_on_resume(out: Path) -> None:
    logger = MetricsLogger(out, total_steps=2)
    logger.log(0, {"x": 1.0})
    MetricsLogger(out, total_steps=2, start_step=1).log(1, {"x": 2.0})


def summary_written(out: Path) -> None:
    write_summary(out, {"steps": 1})


def marker_written(out: Path) -> None:
    save(out)


# (the path a symlink is planted at, relative to the output directory; what writes there)
WRITES: dict[str, tuple[str, Callable[[Path], None]]] = {
    "metrics.jsonl": (METRICS_FILE, metrics_appended),
    "metrics.jsonl, rewritten on resume": (METRICS_FILE, metrics_rewritten_on_resume),
    "the old fixed temporary metrics file": ("metrics.jsonl.tmp", metrics_rewritten_on_resume),
    "summary.json": ("summary.json", summary_written),
    "checkpoints/latest": ("latest", marker_written),
    "the old fixed temporary marker": ("latest.tmp", marker_written),
}


@pytest.mark.parametrize("case", WRITES)
def test_a_symlink_planted_where_the_run_writes_leaves_its_target_alone(tmp_path, victim, case):
    name, write = WRITES[case]
    out = tmp_path / "out"
    plant(out / name, victim)
    write(out)
    assert victim.read_text() == VICTIM
    if not name.endswith(".tmp"):
        assert not (out / name).is_symlink(), "the link was not replaced"


def test_a_symlink_planted_while_the_run_appends_stops_it_in_one_line(tmp_path, victim):
    out = tmp_path / "out"
    logger = MetricsLogger(out, total_steps=2)
    logger.log(0, {"x": 1.0})
    (out / METRICS_FILE).unlink()
    plant(out / METRICS_FILE, victim)
    with pytest.raises(MetricsError) as raised:
        logger.log(1, {"x": 2.0})
    assert str(raised.value) == (
        f"{out / METRICS_FILE}: cannot write it (Too many levels of symbolic links)"
    )
    assert victim.read_text() == VICTIM


def test_a_symlinked_wandb_run_id_is_neither_read_nor_written(tmp_path, victim, monkeypatch):
    """The run id goes to wandb: a planted link must not send another file's content there."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "out"
    plant(out / "wandb_run_id", victim)
    config = parse_args(["--hf-checkpoint", "m", "--prompt-data", "p.jsonl", "--use-wandb",
                         "--wandb-mode", "offline", "--output-dir", str(out)])  # fmt: skip
    with pytest.raises(MetricsError, match="wandb_run_id: cannot write it"):
        MetricsLogger(out, total_steps=1, config=config)
    assert victim.read_text() == VICTIM


def test_a_planted_partial_checkpoint_is_refused_or_replaced(tmp_path, victim):
    """``iter_N.partial``: a symlink there (to a directory of someone else's) is refused; a
    leftover of this user's, with links planted at ``state.json`` and the adapter's check
    file, is removed and written anew."""
    root = tmp_path / "ckpt"
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    (victim_dir / "state.json").write_text(VICTIM)
    plant(root / "iter_0000002.partial", victim_dir)
    with pytest.raises(checkpoint.SaveError) as raised:
        save(root)
    assert str(raised.value) == (
        f"cannot save {root / 'iter_0000002'}: {root / 'iter_0000002.partial'} is not a "
        "directory (someone else's link or file?); remove it"
    )
    assert [p.name for p in victim_dir.iterdir()] == ["state.json"]
    assert (victim_dir / "state.json").read_text() == VICTIM

    (root / "iter_0000002.partial").unlink()
    plant(root / "iter_0000002.partial" / "state.json", victim)
    plant(root / "iter_0000002.partial" / "adapter" / adapter_check.CHECK_FILE, victim)
    save(root)
    assert victim.read_text() == VICTIM
    assert checkpoint.resume_point(root) == checkpoint.Resume(2)
    assert adapter_check.read(root / "iter_0000002" / "adapter").logprobs == [-0.5]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_a_partial_checkpoint_of_another_user_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    (root / "iter_0000002.partial").mkdir(parents=True)
    os.chown(root / "iter_0000002.partial", 4242, 4242)
    with pytest.raises(checkpoint.SaveError, match="belongs to uid 4242, not to this user"):
        save(root)


def test_an_output_directory_others_may_write_to_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o775)
    with pytest.raises(MetricsError, match=r"may be changed by other users \(mode 775\)"):
        MetricsLogger(out, total_steps=1)
    assert not (out / METRICS_FILE).exists()
    with pytest.raises(checkpoint.SaveError, match=r"may be changed by other users \(mode 775\)"):
        save(out / "ckpt")


def as_other_user(*argv: str) -> subprocess.CompletedProcess:
    """`argv` run as uid 4242 (no groups), or a skip where that cannot be done."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user")
    setpriv = ["setpriv", "--reuid", "4242", "--regid", "4242", "--clear-groups"]
    return subprocess.run([*setpriv, *argv], capture_output=True, text=True, check=True)


def test_an_output_directory_another_user_made_first_is_refused():
    """Another user creates the output directory in a shared sticky folder (as /tmp is) and
    plants a link in it before the run starts: the run refuses the directory, before writing."""
    shared = Path(tempfile.mkdtemp(prefix="shared-", dir="/tmp"))
    try:
        shared.chmod(0o1777)
        out = shared / "out"
        victim = shared / "victim"
        victim.write_text(VICTIM)
        as_other_user("sh", "-c", f"mkdir {out} && ln -s {victim} {out / METRICS_FILE}")
        assert out.stat().st_uid == 4242
        with pytest.raises(owned_files.NotPrivate, match=r"\(owner uid 4242\)"):
            owned_files.check_dir(out)
        with pytest.raises(MetricsError, match=r"\(owner uid 4242\)"):
            MetricsLogger(out, total_steps=1)
        assert victim.read_text() == VICTIM
    finally:
        shutil.rmtree(shared)
