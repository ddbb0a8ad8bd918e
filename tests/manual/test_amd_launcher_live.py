"""Live: the AMD launcher's full-train on an MI350X / MI355X node, two rollouts.

Run on purpose on the node: ``pytest -m rocm_gpu tests/manual/test_amd_launcher_live.py``.
It downloads Qwen3-4B and DAPO-Math-17k into ``--model-dir`` / ``--data-dir`` (defaults under
``~``; set GRPO_LAUNCHER_MODEL_DIR / GRPO_LAUNCHER_DATA_DIR to reuse a cache), starts Ray,
and trains with the production backends (Megatron-Bridge, SGLang with Triton).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.hardware import match_hardware
from harness.host import CHECKOUT, detect_gpus
from tests.manual.live_run import as_settings

pytestmark = pytest.mark.rocm_gpu

RUN_ID = "live-two-rollouts"
MODULE = "launchers.amd.run_qwen3_4b_lora"
SHORT = [
    *as_settings(["--num-rollout", "2", "--save-interval", "1"]),
    *as_settings(["--eval-interval", "", "--eval-prompt-data", ""]),
    "--wandb-mode",
    "disabled",
]


def test_full_train_runs_two_rollouts_and_saves(tmp_path):
    found = match_hardware(detect_gpus() or "")
    if found is None or found.name not in ("MI350X", "MI355X"):
        pytest.skip(f"rocm_gpu: needs an MI350X or MI355X node, found {found or 'none'}")
    output = ["--run-id", RUN_ID, "--output-dir", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", MODULE, "full-train", *SHORT, *output],
        cwd=CHECKOUT,
        timeout=3 * 3600,
        check=False,
    )
    assert done.returncode == 0, "full-train failed; its output is above"
    run_dir = tmp_path / RUN_ID
    assert any((run_dir / "checkpoints").iterdir()), "no checkpoint saved"
    assert (run_dir / "metrics.jsonl").read_text().strip(), "no metrics written"
