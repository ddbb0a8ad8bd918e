"""A resumed run is the same run on one NVIDIA GPU in bf16 (portable backends, no Ray): the
tiny recipe stopped after rollout 3 and run again resumes from its checkpoint of rollout 2 and
ends where the run uninterrupted ends (`tests/trainer/test_resume_same_run.py` proves it bit for
bit on the CPU, through ``train.py`` and Ray).

Run on purpose: ``pytest -m cuda_gpu tests/manual/test_cuda_resume.py -s``. Self-contained: it
builds the tiny model, and each run is its own process (`tests.manual.resume_run`) with
deterministic algorithms asked for (``torch.use_deterministic_algorithms``, warn only, and
``CUBLAS_WORKSPACE_CONFIG=:4096:8``).

Tolerance: what the GPU itself allows, measured. The recipe runs uninterrupted twice; the
resumed run may differ from the first by at most twice what the second does, per tensor and
per metric. Where the GPU is deterministic (the second run bit for bit the first) that is
zero: the resumed run must then be bit for bit the same. What no rounding touches is compared
exactly: the files, ``state.json`` (data cursor, rollout index), the step count, the LR
schedule's state, the CPU and CUDA random states, the metrics' keys and steps.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.manual.resume_run import EXIT_STOPPED, ROLLOUTS
from trainer.run import checkpoint, tensor_state
from trainer.run.metrics import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parents[2]


def run(model: Path, data: Path, directory: Path, device: str, *extra: str) -> int:
    env = {**os.environ, "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    argv = [sys.executable, "-m", "tests.manual.resume_run", str(model), str(data),
            str(directory), "--device", device, *extra]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    print(done.stdout[-3000:])
    assert done.returncode in (0, EXIT_STOPPED), done.stderr[-4000:]
    return done.returncode


def tensors(directory: Path) -> dict[str, object]:
    """Every tensor of the run's last checkpoint by a readable name, and its trainer state."""
    from safetensors.torch import load_file

    final = checkpoint.iter_dir(directory / "ckpt", ROLLOUTS)
    adapter = load_file(final / "adapter" / "adapter_model.safetensors")
    found = {f"adapter/{name}": value for name, value in adapter.items()}
    state = tensor_state.load(final / "trainer_state")
    for param, moments in state["optimizer"]["state"].items():
        for key, value in moments.items():
            found[f"optimizer/{param}/{key}"] = value
    return found


def max_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def metric_diffs(one: list[dict], other: list[dict]) -> dict[str, float]:
    """Per metric (timings left out), the largest difference over the steps; inf where one is
    null and the other not."""
    diffs: dict[str, float] = {}
    for a, b in zip(one, other, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("time/") or key == "step":
                continue
            if a[key] is None or b[key] is None:
                diff = 0.0 if a[key] is b[key] else math.inf
            else:
                diff = abs(a[key] - b[key])
            diffs[key] = max(diffs.get(key, 0.0), diff)
    return diffs


@pytest.mark.cuda_gpu
@pytest.mark.timeout(1800)
def test_a_resumed_run_ends_where_the_uninterrupted_run_does_on_the_gpu(tmp_path):
    check_resume(tmp_path, "cuda")


def check_resume(tmp_path: Path, device: str) -> None:
    """The comparison on `device` (``cpu``: the same in fp32, to try it without a GPU)."""
    import torch

    from trainer import tiny

    model, data = tmp_path / "model", tmp_path / "data"
    tiny.build(model, data, seed=0)
    first, second, resumed = tmp_path / "first", tmp_path / "second", tmp_path / "resumed"
    assert run(model, data, first, device) == 0
    assert run(model, data, second, device) == 0
    assert run(model, data, resumed, device, "--stop-after", "3") == EXIT_STOPPED
    assert checkpoint.resume_point(resumed / "ckpt") == checkpoint.Resume(2)
    assert run(model, data, resumed, device) == 0

    a, b = (checkpoint.iter_dir(d / "ckpt", ROLLOUTS) for d in (first, resumed))
    names = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for name in ("state.json", "adapter/adapter_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    states = [tensor_state.load(d / "trainer_state") for d in (a, b)]
    for key in ("steps", "scheduler"):
        assert states[0][key] == states[1][key], key
    rng = ["torch_rng", "cuda_rng"] if device == "cuda" else ["torch_rng"]
    for key in rng:
        assert torch.equal(states[0][key], states[1][key]), key

    reference, noise, got = tensors(first), tensors(second), tensors(resumed)
    assert reference.keys() == got.keys()
    worst = []
    for name, value in reference.items():
        allowed = 2 * max_diff(value, noise[name])
        diff = max_diff(value, got[name])
        worst.append((diff, allowed, name))
        assert diff <= allowed, f"{name}: resumed differs by {diff:.3g}, noise {allowed / 2:.3g}"
    print("largest tensor differences (resumed, allowed):", sorted(worst, reverse=True)[:3])

    records = [read_metrics(d / "out" / METRICS_FILE) for d in (first, second, resumed)]
    assert [r["step"] for r in records[2]] == list(range(ROLLOUTS))
    floor, diffs = metric_diffs(records[0], records[1]), metric_diffs(records[0], records[2])
    for key, diff in diffs.items():
        assert diff <= 2 * floor[key], (
            f"{key}: resumed differs by {diff:.3g}, noise {floor[key]:.3g}"
        )
    print("metric noise between two uninterrupted runs:", {k: v for k, v in floor.items() if v})
