"""Checkpoints: layout, the atomic ``latest`` marker, and an exact resume of the loop."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.test_loop import LocalTrainers, make_loop, recipe_argv, tiny_dirs  # noqa: F401
from trainer.run import checkpoint
from trainer.run.metrics import METRICS_FILE, read_metrics


def fake_trainer_save(path) -> None:
    (path / "adapter").mkdir()
    (path / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")


def test_save_writes_the_iteration_then_the_marker(tmp_path):
    assert checkpoint.latest_iteration(None) is None
    assert checkpoint.latest_iteration(tmp_path / "missing") is None
    assert checkpoint.latest_iteration(tmp_path) is None

    path = checkpoint.save(tmp_path, 4, fake_trainer_save, {"rollout_index": 4})
    assert path == tmp_path / "iter_0000004"
    assert (tmp_path / "latest").read_text() == "4\n"
    assert checkpoint.latest_iteration(tmp_path) == 4
    assert checkpoint.load_state(tmp_path, 4) == {"rollout_index": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000004", "latest"]


def test_a_save_interrupted_before_the_marker_leaves_the_previous_checkpoint(tmp_path):
    checkpoint.save(tmp_path, 2, fake_trainer_save, {"rollout_index": 2})

    def dies(path):
        fake_trainer_save(path)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 4, dies, {"rollout_index": 4})
    assert checkpoint.latest_iteration(tmp_path) == 2
    assert not (tmp_path / "iter_0000004").exists()
    checkpoint.save(tmp_path, 4, fake_trainer_save, {"rollout_index": 4})  # the retry succeeds
    assert checkpoint.latest_iteration(tmp_path) == 4


@pytest.mark.parametrize(("marker", "message"), [("x\n", "expected an iteration"), ("9\n", "9")])
def test_a_bad_marker_is_a_clear_error(tmp_path, marker, message):
    (tmp_path / "latest").write_text(marker)
    with pytest.raises(checkpoint.CheckpointError, match=message):
        checkpoint.latest_iteration(tmp_path)


def test_a_resumed_loop_continues_exactly_where_it_stopped(tiny_dirs, tmp_path):  # noqa: F811
    """4 rollouts in one go == 2 rollouts, a checkpoint, and a fresh loop resuming for 2 more,
    metrics included: the resumed run's first rollout checks, as the straight run's does, that
    the engine serves the adapter of the update before (here the checkpoint's)."""
    model, data = tiny_dirs
    straight, _ = make_loop(
        recipe_argv(model, data, tmp_path / "a", "--num-rollout", "4", "--save",
                    str(tmp_path / "a" / "ckpt"), "--save-interval", "2", "--check-adapter-sync")
    )  # fmt: skip
    straight.run()

    resumed_dir = tmp_path / "b"
    argv = recipe_argv(
        model, data, resumed_dir, "--num-rollout", "4", "--save", str(resumed_dir / "ckpt"),
        "--load", str(resumed_dir / "ckpt"), "--save-interval", "2", "--check-adapter-sync",
    )  # fmt: skip
    first, _ = make_loop(argv)
    generate = first.engines.generate
    calls = []

    def killed_in_rollout_3(prompts, params):
        calls.append(params)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return generate(prompts, params)

    first.engines.generate = killed_in_rollout_3
    with pytest.raises(KeyboardInterrupt):
        first.run()
    assert checkpoint.latest_iteration(resumed_dir / "ckpt") == 2
    state = checkpoint.load_state(resumed_dir / "ckpt", 2)
    assert state["rollout_index"] == 2 and state["data"]["offset"] == 8

    second, _ = make_loop(argv)
    assert second.restore() == 2
    assert second.pending is not None and second.pending.version == 4
    second.run()

    a = read_metrics(tmp_path / "a" / METRICS_FILE)
    b = read_metrics(resumed_dir / METRICS_FILE)
    assert [r["step"] for r in b] == [0, 1, 2, 3]

    def stable(record):
        return {k: v for k, v in record.items() if not k.startswith("time/")}

    assert [stable(r) for r in a] == [stable(r) for r in b]
    assert all("sync/engine_trainer_logprob_abs_diff" in r for r in b[1:])
    final_a = json.loads((tmp_path / "a" / "ckpt" / "iter_0000004" / "state.json").read_text())
    final_b = json.loads((resumed_dir / "ckpt" / "iter_0000004" / "state.json").read_text())
    assert final_a == final_b


def whole_trainer_save(path) -> None:
    from safetensors.torch import save_file

    (path / "adapter").mkdir()
    save_file({"w": torch.zeros(2)}, str(path / "adapter" / "adapter_model.safetensors"))


def saved(root, *iterations: int) -> None:
    for iteration in iterations:
        state = {"rollout_index": iteration, "data": {}}
        checkpoint.save(root, iteration, whole_trainer_save, state)


def test_a_save_that_died_before_its_marker_is_resumed_from(tmp_path):
    """A full disk (or a kill) after ``iter_N`` was renamed leaves ``latest`` naming an older
    checkpoint, or none: the newest complete checkpoint that verifies is resumed, with a note."""
    saved(tmp_path, 2, 4)
    (tmp_path / "latest").write_text("2\n")
    assert checkpoint.resume_point(tmp_path) == checkpoint.Resume(
        4, f"{tmp_path / 'latest'} names 2, but iter_0000004 is complete: resuming from it"
    )
    (tmp_path / "latest").unlink()
    assert checkpoint.resume_point(tmp_path).iteration == 4
    (tmp_path / "iter_0000006.partial").mkdir()  # a save cut short is not a checkpoint
    assert checkpoint.resume_point(tmp_path).iteration == 4

    cut = tmp_path / "iter_0000004" / "adapter" / "adapter_model.safetensors"
    cut.write_bytes(cut.read_bytes()[:20])
    resume = checkpoint.resume_point(tmp_path)
    assert resume.iteration == 2 and resume.note.startswith(f"passing over {cut}: not a complete")
    (tmp_path / "latest").write_text("2\n")
    assert checkpoint.resume_point(tmp_path).iteration == 2

    shutil.rmtree(tmp_path / "iter_0000002")
    (tmp_path / "latest").unlink()
    with pytest.raises(checkpoint.CheckpointError, match=f"^{cut}: not a complete safetensors"):
        checkpoint.resume_point(tmp_path)
    assert checkpoint.resume_point(tmp_path / "absent") is None


def test_a_rerun_after_a_lost_marker_resumes_from_the_newest_checkpoint(
    tiny_dirs,  # noqa: F811
    tmp_path,
):
    """What a full disk at ``latest`` leaves (iter_2 complete, ``latest`` still 1) once made
    a rerun start over from 1, or, with no ``latest``, from 0 with metrics.jsonl truncated."""
    model, data = tiny_dirs
    ckpt = tmp_path / "ckpt"
    argv = recipe_argv(model, data, tmp_path, "--num-rollout", "2", "--save", str(ckpt),
                       "--load", str(ckpt), "--save-interval", "1")  # fmt: skip
    make_loop(argv)[0].run()
    for marker in ("1\n", None):
        if marker is None:
            (ckpt / "latest").unlink()
        else:
            (ckpt / "latest").write_text(marker)
        rerun, _ = make_loop(argv)
        assert rerun.restore() == 2


class FullDiskTrainers(LocalTrainers):
    """A trainer whose save fills the disk half-way through its files."""

    def save(self, path):
        (path / "adapter").mkdir()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path / "adapter" / "x"))


def test_a_save_on_a_full_disk_is_one_line_and_leaves_the_earlier_checkpoint(
    tiny_dirs,  # noqa: F811
    tmp_path,
):
    model, data = tiny_dirs
    ckpt = tmp_path / "ckpt"
    loop, trainers = make_loop(recipe_argv(model, data, tmp_path, "--save", str(ckpt)))
    loop.save(2)
    loop.trainers = FullDiskTrainers(trainers.trainer)
    with pytest.raises(checkpoint.SaveError) as raised:
        loop.save(4)
    partial = ckpt / "iter_0000004.partial"
    assert str(raised.value) == (
        f"saving {ckpt / 'iter_0000004'} failed: No space left on device "
        f"({partial / 'adapter' / 'x'}); the checkpoints before it are whole"
    )
    assert not partial.exists() and not (ckpt / "iter_0000004").exists()
    assert checkpoint.resume_point(ckpt) == checkpoint.Resume(2)


@pytest.fixture
def small_disk(tmp_path):
    """A 48 KiB tmpfs (root with mount rights only): too small for the recipe's checkpoint."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_really_full_disk_is_one_line(tiny_dirs, tmp_path, small_disk):  # noqa: F811
    """The same on a disk that fills: safetensors reports it in an error of its own."""
    model, data = tiny_dirs
    ckpt = small_disk / "ckpt"
    argv = recipe_argv(model, data, tmp_path, "--num-rollout", "1", "--save", str(ckpt))
    loop, _ = make_loop(argv)
    with pytest.raises(checkpoint.SaveError) as raised:
        loop.run()
    assert str(raised.value).startswith(f"saving {ckpt / 'iter_0000001'} failed: ")
    assert "No space left on device" in str(raised.value) and "\n" not in str(raised.value)
    assert list(ckpt.iterdir()) == []


class Planted:
    """What another user plants as a ``trainer_state.pt``: unpickling it runs a command."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_is_never_loaded(tiny_dirs, tmp_path):  # noqa: F811
    """A ``trainer_state.pt`` in a checkpoint (the old format, or planted) is refused in one
    line before the trainer starts, and the trainer's own load never reads it either."""
    model, data = tiny_dirs
    ckpt = tmp_path / "ckpt"
    argv = recipe_argv(model, data, tmp_path, "--num-rollout", "1", "--save", str(ckpt),
                       "--load", str(ckpt))  # fmt: skip
    loop, trainers = make_loop(argv)
    loop.save(1)
    path = ckpt / "iter_0000001"
    marker = tmp_path / "the-planted-pickle-ran"
    torch.save(Planted(marker), path / "trainer_state.pt")
    for state in path.glob("trainer_state.*"):
        if state.suffix != ".pt":
            state.unlink()  # as a checkpoint of the old format holds

    with pytest.raises(checkpoint.CheckpointError) as raised:
        make_loop(argv)[0].restore()
    assert str(raised.value) == (
        f"{path / 'trainer_state.pt'}: a torch.save (pickle) file of an earlier version, which "
        "is never loaded (loading a pickle runs the code it names); start without --load, or "
        "with an empty --save directory"
    )
    with pytest.raises(checkpoint.CheckpointError, match="no trainer state to resume"):
        trainers.trainer.load(path)
    assert not marker.exists(), "the planted pickle ran"


SAVE_ADAPTER = """
import sys
from pathlib import Path
from trainer.arguments import parse_args
from trainer.backends.torch.trainer import create

config = parse_args(["--hf-checkpoint", sys.argv[1], "--prompt-data", "p.jsonl", "--device", "cpu"])
create(config, "cpu", total_steps=1).save(Path(sys.argv[2]))
"""


def test_the_saved_adapter_does_not_depend_on_the_process_hash_seed(tiny_dirs, tmp_path):  # noqa: F811
    """``all-linear`` resolves to a set of module names, which PEFT saved in the hash seed's
    order: a resumed run (another process) wrote another adapter_config.json than the run
    uninterrupted."""
    model, _ = tiny_dirs
    for seed in ("1", "2"):
        subprocess.run(
            [sys.executable, "-c", SAVE_ADAPTER, str(model), str(tmp_path / seed)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            capture_output=True,
        )
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        one, other = (tmp_path / seed / "adapter" / name for seed in ("1", "2"))
        assert one.read_bytes() == other.read_bytes(), name


@pytest.mark.slow
@pytest.mark.ray
def test_a_full_disk_stops_train_py_in_one_line(tiny_dirs, tmp_path, small_disk, private_ray):  # noqa: F811
    """Through train.py and Ray: the trainer's actor hits the full disk, the job ends with the
    one line (exit 1), and nothing of the checkpoint is left."""
    model, data = tiny_dirs
    ckpt = small_disk / "ckpt"
    argv = recipe_argv(model, data, tmp_path / "out", "--num-rollout", "1", "--save", str(ckpt))
    done = subprocess.run(
        [sys.executable, "train.py", *argv],
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, **private_ray.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 1, done.stderr[-3000:]
    assert errors == [
        f"train.py: error: saving {ckpt / 'iter_0000001'} failed: Error while serializing: I/O "
        "error: No space left on device (os error 28); the checkpoints before it are whole"
    ], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and list(ckpt.iterdir()) == []
