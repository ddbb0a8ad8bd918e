"""The CPU launcher's recipe on an NVIDIA GPU in bf16 (portable backends, local Ray), and the
transformers engine's colocated release on the GPU.

Run on purpose: ``pytest -m cuda_gpu tests/manual/test_cuda_portable.py -s``. Needs Ray in the
environment; ``train.py`` starts its own local Ray instance (no ``ray start``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import build_plan
from harness.host import local_host
from harness.steps import train_py_argv
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER
from trainer.run.metrics import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parents[2]


def recipe_argv(tmp_path: Path) -> list[str]:
    """The launcher's own train.py argv, moved from the CPU to the GPU in bf16."""
    args = LAUNCHER.args(
        model_dir=str(tmp_path / "models"),
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "outputs"),
        run_id="cuda",
    )
    plan = build_plan(LAUNCHER, "train", args, local_host())
    [argv] = [a for a in map(train_py_argv, plan.steps) if a is not None]
    argv = list(argv)
    argv[argv.index("--device") + 1] = "cuda"
    return [*argv, "--dtype", "bf16"]


@pytest.mark.cuda_gpu
@pytest.mark.timeout(900)
def test_tiny_recipe_trains_on_the_gpu_in_bf16(tmp_path):
    from trainer import tiny

    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket path limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    done = subprocess.run(
        [sys.executable, "train.py", *recipe_argv(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    print(done.stdout[-6000:])
    assert done.returncode == 0, done.stderr[-4000:]
    assert " samples on cuda: " in done.stdout

    run_dir = tmp_path / "outputs" / "cuda"
    records = read_metrics(run_dir / METRICS_FILE)
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [r["time/step"] for r in records]
    print(
        f"cuda bf16: {len(records)} steps, mean {sum(steps) / len(steps):.3f} s/step "
        f"(first {steps[0]:.3f} s), reward {summary['reward_first5']:.3f} -> "
        f"{summary['reward_last5']:.3f}, train/rollout log-prob diff "
        f"{max(r['train/train_rollout_logprob_abs_diff'] for r in records):.4f} max"
    )
    assert [r["step"] for r in records] == list(range(len(records)))
    assert summary["reward_last5"] >= 2 * summary["reward_first5"], summary
    assert Path(summary["adapter"], "adapter_model.safetensors").is_file()


@pytest.mark.cuda_gpu
@pytest.mark.parametrize("merged", [False, True], ids=["adapter", "merged"])
def test_the_transformers_engine_gives_back_all_its_gpu_memory_and_resumes(tmp_path, merged):
    """Released, the engine holds nothing on the GPU, the base weights it keeps to merge into
    included; resumed, it serves the same policy."""
    import torch

    from trainer import tiny
    from trainer.backends.base import SamplingParams
    from trainer.backends.torch.rollout import HFRolloutEngine
    from trainer.backends.torch.trainer import PeftPolicyTrainer
    from trainer.config import LoraConfig, OptimizerConfig

    model = tmp_path / "model"
    tiny.build(model, tmp_path / "data", seed=0)
    trainer = PeftPolicyTrainer(
        str(model), LoraConfig(lora_rank=4, lora_alpha=8.0), OptimizerConfig(lr=1e-2),
        total_steps=1, device="cuda", dtype="bf16", merged=merged,
    )  # fmt: skip
    engine = HFRolloutEngine(str(model), device="cuda", dtype="bf16", merged=merged)
    engine.load_adapter(trainer.export_adapter())
    ids = list(range(3, 11))
    before = engine.score(ids)
    engine_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    kept = sum(w.numel() * w.element_size() for w in getattr(engine.merger, "base", {}).values())
    assert kept > 0 if merged else kept == 0
    held = torch.cuda.memory_allocated()
    engine.release_memory()
    released = held - torch.cuda.memory_allocated()
    print(f"{'merged' if merged else 'adapter'}: released {released} of {engine_bytes + kept} B")
    assert released >= engine_bytes + kept
    engine.resume_memory()
    assert engine.score(ids) == before
    engine.generate([ids], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
