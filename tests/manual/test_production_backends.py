"""Live: both production backends (Megatron-Bridge training, SGLang rollout) for two rollouts.

Runs the Qwen3-4B launcher's ``full-train`` on a whole node and checks what the production
backends must deliver: the job succeeds, the trainer's log-probabilities agree with SGLang's
(``train_rollout_logprob_abs_diff`` mean < 0.03, the upstream recipe's threshold), and the saved
adapter loads with PEFT onto the base model and is not the identity.

    pytest -m rocm_gpu tests/manual/test_production_backends.py   # 8x MI350X / MI355X, ROCm
    pytest -m cuda_gpu tests/manual/test_production_backends.py   # 8x H100 / H200

The node needs SGLang, Megatron-core, Megatron-Bridge and Transformer Engine (AMD's or NVIDIA's
images), Ray, and the Hub (or the inputs already under GRPO_LAUNCHER_MODEL_DIR /
GRPO_LAUNCHER_DATA_DIR, which the launchers read).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.hardware import match_hardware
from harness.host import CHECKOUT, detect_gpus
from tests.manual.live_run import as_settings
from trainer.run.checkpoint import ADAPTER_DIR, iter_dir
from trainer.run.metrics import METRICS_FILE, read_metrics

RUN_ID = "production-backends"
ROLLOUTS = 2
# Two short rollouts: 8 prompts x 8 samples, responses up to 2048 tokens, a checkpoint each.
SHORT = [
    *as_settings(["--num-rollout", str(ROLLOUTS), "--save-interval", "1",
                  "--rollout-max-response-len", "2048", "--eval-interval", "",
                  "--eval-prompt-data", ""]),
    "--wandb-mode", "disabled",
]  # fmt: skip
LOGPROB_DIFF_LIMIT = 0.03


def _run_two_rollouts(module: str, hardware: tuple[str, ...], output: Path) -> Path:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist in this checkout")
    found = match_hardware(detect_gpus() or "")
    if found is None or found.name not in hardware:
        pytest.skip(f"needs a {' or '.join(hardware)} node, found {found or 'no GPU'}")
    command = [sys.executable, "-m", module, "full-train", "--hardware", found.name, *SHORT]
    done = subprocess.run(
        [*command, "--run-id", RUN_ID, "--output-dir", str(output)],
        cwd=CHECKOUT,
        timeout=3 * 3600,
        check=False,
    )
    assert done.returncode == 0, f"{module} full-train failed (exit {done.returncode}); see above"
    return output / RUN_ID


def _check_run(run_dir: Path) -> None:
    records = read_metrics(run_dir / METRICS_FILE)
    assert len(records) == ROLLOUTS, f"expected {ROLLOUTS} metric records, got {len(records)}"
    diffs = [r["train/train_rollout_logprob_abs_diff"] for r in records]
    mean = sum(diffs) / len(diffs)
    assert mean < LOGPROB_DIFF_LIMIT, f"train_rollout_logprob_abs_diff mean {mean:.4f} ({diffs})"

    adapter_dir = iter_dir(run_dir / "checkpoints", ROLLOUTS) / ADAPTER_DIR
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    }  # fmt: skip
    _reload_with_peft(adapter_dir, Path(config["base_model_name_or_path"]))


def _reload_with_peft(adapter_dir: Path, base_dir: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.bfloat16)
    layers = base.config.num_hidden_layers
    model = PeftModel.from_pretrained(base, adapter_dir)
    lora_b = {n: p for n, p in model.named_parameters() if "lora_B" in n}
    assert len(lora_b) == 7 * layers, f"{len(lora_b)} lora_B tensors for {layers} layers"
    # B starts at zero; two optimizer steps must have moved it.
    assert any(p.abs().sum() > 0 for p in lora_b.values()), "the adapter is still the identity"


@pytest.mark.rocm_gpu
def test_amd_launcher_trains_two_rollouts_on_mi355x(tmp_path: Path) -> None:
    run_dir = _run_two_rollouts("launchers.amd.run_qwen3_4b_lora", ("MI350X", "MI355X"), tmp_path)
    _check_run(run_dir)


@pytest.mark.cuda_gpu
def test_cuda_launcher_trains_two_rollouts_on_h100_or_h200(tmp_path: Path) -> None:
    run_dir = _run_two_rollouts("launchers.run_qwen3_4b_lora", ("H100", "H200"), tmp_path)
    _check_run(run_dir)
