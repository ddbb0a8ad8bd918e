"""The CPU launcher's full-train, live: Ray started, the real GRPO LoRA job submitted, stopped.

The launcher runs through its real CLI with a step runner that keeps it on this test's own Ray
(tests/private_ray.py), which is stopped also when the test fails.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from harness.live import execute_plan
from trainer.metrics import METRICS_FILE, read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


def test_cpu_launcher_full_train_runs_live_and_the_reward_rises(private_ray, tmp_path, capsys):
    from harness.cli import run
    from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER

    argv = [
        "full-train", "--run-id", "e2e", "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--ray-port", str(private_ray.ray_port),
        "--dashboard-port", str(private_ray.dashboard_port),
    ]  # fmt: skip
    started = time.perf_counter()
    status = run(LAUNCHER, argv, live=lambda plan: execute_plan(plan, run=private_ray.run))
    elapsed = time.perf_counter() - started
    out = capsys.readouterr().out
    assert status == 0, out[-4000:]

    assert private_ray.ran == [
        "shell",
        "process_cleanup",
        "ray_start",
        "ray_job_submit",
        "ray_stop",
    ]
    assert private_ray.seen_processes > 0  # Ray really started
    [(entrypoint, job_status)] = private_ray.jobs
    assert entrypoint.startswith("python3 train.py --hf-checkpoint") and job_status == "SUCCEEDED"
    assert private_ray.processes() == []  # and stopped again

    run_dir = tmp_path / "outputs" / "e2e"
    records = read_metrics(run_dir / METRICS_FILE)
    assert [r["step"] for r in records] == list(range(30))
    assert "step 30/30 | reward" in out and "GRPO LoRA run finished" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    adapter = Path(summary["adapter"])
    assert adapter == run_dir / "checkpoints" / "iter_0000030" / "adapter"
    assert summary["reward_last5"] >= 2 * summary["reward_first5"], summary

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tmp_path / "models" / "tiny-qwen3")
    model = PeftModel.from_pretrained(base, adapter)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)
    print(
        f"e2e: {elapsed:.1f} s, reward {summary['reward_first5']:.3f} -> "
        f"{summary['reward_last5']:.3f}, {summary['mean_step_s']:.2f} s/step"
    )
