"""A resumed run is provably the same run: interrupted (SIGTERM, or SIGKILL in the middle of a
checkpoint) and started again with the same command, it ends with the adapter, optimizer state,
LR-schedule position, data cursor, RNG state and metrics (all but the ``time/*`` keys) of the
same run uninterrupted, bit for bit.

The tiny CPU recipe through ``python3 train.py`` (its own private Ray): 6 rollouts, a checkpoint
every 2, two data-parallel training ranks colocated with one engine, shuffled prompts, two
optimizer steps per rollout with a warmup-then-cosine LR schedule, an eval every 3 rollouts and
the adapter sync check.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.manual.resume_run import ROLLOUTS, recipe
from tests.support.private_ray import PrivateRay
from trainer import tiny
from trainer.run import checkpoint, tensor_state
from trainer.run.metrics import METRICS_FILE, read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]


def command(model: Path, data: Path, run: Path) -> list[str]:
    """The recipe of the GPU test (`tests.manual.resume_run`) through train.py and Ray: two
    training ranks and two engines, colocated."""
    placement = ["--actor-num-gpus-per-node", "2", "--rollout-num-gpus-per-engine", "2"]
    return [sys.executable, "train.py", *recipe(model, data, run, "cpu"), *placement, "--colocate"]


class Runs:
    """Runs of the recipe, each with a private Ray stopped afterwards (whatever a kill left)."""

    def __init__(self, model: Path, data: Path) -> None:
        self.model, self.data = model, data

    def start(self, run: Path, ray: PrivateRay) -> subprocess.Popen:
        run.mkdir(parents=True, exist_ok=True)
        log = (run / "log.txt").open("a")
        argv = command(self.model, self.data, run)
        env = {**os.environ, **ray.env}
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log)

    def complete(self, run: Path) -> str:
        """Run to the end (a fresh start or a resume); its output."""
        ray = PrivateRay()
        try:
            process = self.start(run, ray)
            assert process.wait(timeout=600) == 0, (run / "log.txt").read_text()[-4000:]
        finally:
            ray.cleanup()
        return (run / "log.txt").read_text()

    def interrupt(self, run: Path, sig: signal.Signals, *, after_steps: int, delay: float) -> None:
        """Start a run and send it `sig` `delay` s after its `after_steps`-th metrics line."""
        ray = PrivateRay()
        try:
            process = self.start(run, ray)
            deadline = time.time() + 300
            while len(read_metrics(run / "out" / METRICS_FILE)) < after_steps:
                assert process.poll() is None, (run / "log.txt").read_text()[-4000:]
                assert time.time() < deadline, "too few metrics lines within 300 s"
                time.sleep(0.02)
            time.sleep(delay)
            process.send_signal(sig)
            process.wait(timeout=60)
        finally:
            ray.cleanup()  # the driver's Ray, whatever survived it


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=0)
    return Runs(root / "model", root / "data")


@pytest.fixture(scope="module")
def straight(runs, tmp_path_factory) -> Path:
    """The run uninterrupted."""
    run = tmp_path_factory.mktemp("straight")
    runs.complete(run)
    return run


def stable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def assert_same_run(run: Path, straight: Path) -> None:
    """`run` ended where the uninterrupted run did: its last checkpoint's every file (adapter
    tensors, optimizer and LR-schedule state, step count, RNG state, data cursor, sync check)
    and its metrics."""
    import torch
    from safetensors.torch import load_file

    from tests.trainer.run.test_tensor_state import assert_same

    a = checkpoint.iter_dir(straight / "ckpt", ROLLOUTS)
    b = checkpoint.iter_dir(run / "ckpt", ROLLOUTS)
    assert checkpoint.resume_point(run / "ckpt") == checkpoint.Resume(ROLLOUTS)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for name in files:
        if name.suffix == ".safetensors":
            one, other = load_file(a / name), load_file(b / name)
            assert one.keys() == other.keys(), name
            for key in one:
                assert torch.equal(one[key], other[key]), (name, key)
        elif name.suffix == ".json" and name.name.startswith("trainer_state"):
            assert_same(tensor_state.load(a / name.with_suffix("")),
                        tensor_state.load(b / name.with_suffix("")))  # fmt: skip
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    state = tensor_state.load(b / "trainer_state")
    assert state["steps"] == 2 * ROLLOUTS and state["scheduler"]["last_epoch"] == 2 * ROLLOUTS
    records = read_metrics(run / "out" / METRICS_FILE)
    assert [r["step"] for r in records] == list(range(ROLLOUTS))
    assert stable(records) == stable(read_metrics(straight / "out" / METRICS_FILE))
    summary = json.loads((run / "out" / "summary.json").read_text())
    assert summary["adapter"] == str(b / checkpoint.ADAPTER_DIR)


def test_a_run_stopped_with_sigterm_resumes_as_the_same_run(runs, straight, tmp_path):
    run = tmp_path / "sigterm"
    runs.interrupt(run, signal.SIGTERM, after_steps=3, delay=0.0)
    stopped_at = checkpoint.resume_point(run / "ckpt")
    assert stopped_at is not None and stopped_at.iteration < ROLLOUTS
    output = runs.complete(run)
    assert f"resumed from {checkpoint.iter_dir(run / 'ckpt', stopped_at.iteration)}" in output
    assert_same_run(run, straight)


def test_a_run_killed_in_the_middle_of_a_checkpoint_resumes_as_the_same_run(
    runs, straight, tmp_path
):
    """Not a raced kill: exactly what SIGKILL during the save of ``iter_4`` leaves on disk,
    made from the uninterrupted run's files: ``iter_2`` and ``latest`` naming it,
    ``iter_4.partial`` with its adapter cut short and no ``state.json`` (written last), the
    metrics of rollouts 3 and 4 (logged before the save) and a torn line after them, no
    summary."""
    run = tmp_path / "sigkill"
    shutil.copytree(straight / "out", run / "out")
    (run / "out" / "summary.json").unlink()
    ckpt = run / "ckpt"
    ckpt.mkdir()
    shutil.copytree(checkpoint.iter_dir(straight / "ckpt", 2), checkpoint.iter_dir(ckpt, 2))
    (ckpt / "latest").write_text("2\n")
    partial = ckpt / "iter_0000004.partial"
    shutil.copytree(checkpoint.iter_dir(straight / "ckpt", 4), partial)
    (partial / "state.json").unlink()
    adapter = partial / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    metrics = run / "out" / METRICS_FILE
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:4]) + lines[4][:30])

    output = runs.complete(run)
    assert f"resumed from {checkpoint.iter_dir(ckpt, 2)} (next rollout 3/{ROLLOUTS})" in output
    assert "dropping its torn last line" in output
    assert not partial.exists()
    assert_same_run(run, straight)


def test_a_run_killed_at_a_random_moment_resumes_as_the_same_run(runs, straight, tmp_path):
    """A real SIGKILL, at a moment drawn at random (printed, to replay a failure)."""
    seed = random.randrange(2**32)
    draw = random.Random(seed)
    after, delay = draw.randint(1, ROLLOUTS - 1), draw.uniform(0.0, 1.0)
    print(f"random kill: seed {seed}: after metrics line {after}, {delay:.2f} s later")
    run = tmp_path / "random"
    runs.interrupt(run, signal.SIGKILL, after_steps=after, delay=delay)
    runs.complete(run)
    assert_same_run(run, straight)


def test_a_run_resumed_in_one_process_without_ray_is_the_same_run_too(tmp_path):
    """The GPU test's comparison (tests/manual/test_cuda_resume.py) on the CPU in fp32: each
    run one process, trainer and engine in it (where the engine's first adapter once moved the
    trainer's random state at a point a resumed run does not repeat)."""
    from tests.manual.test_cuda_resume import check_resume

    check_resume(tmp_path, "cpu")
