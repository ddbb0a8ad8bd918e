"""The CPU launcher's full-train, live and unaided: Ray started under a run tag, the real GRPO
LoRA job submitted, that Ray stopped again, and nothing else on the node touched.

A foreign Ray (tests/support/private_ray.py) and an unrelated process named ``python3 train.py`` run
beside it, as other users' would on a shared node; both must survive the run.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from harness import ownership
from harness.host import CHECKOUT
from harness.run_tag import RunTag
from tests.support.private_ray import LauncherPorts
from trainer.run.metrics import METRICS_FILE, read_metrics

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(400),
    pytest.mark.usefixtures("cpu_launcher_slot"),  # live CPU launcher runs take turns
]

LAUNCHER_FILE = f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py"


@pytest.fixture
def unrelated_trainer():
    """Someone else's ``python3 train.py``: what the old ``pkill -f`` cleanup killed."""
    process = subprocess.Popen(["bash", "-c", 'exec -a "python3 train.py --unrelated" sleep 600'])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_cpu_launcher_full_train_runs_live_and_the_reward_rises(
    private_ray, unrelated_trainer, tmp_path, capsys
):
    from ray.job_submission import JobSubmissionClient

    from harness.cli import run
    from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER

    private_ray.start_head()
    foreign = {p.pid for p in private_ray.processes()}
    assert foreign
    argv = [
        "full-train", "--run-id", "e2e", "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        *LauncherPorts.draw().argv(),
    ]  # fmt: skip
    started = time.perf_counter()
    status = run(LAUNCHER, argv)
    elapsed = time.perf_counter() - started
    out, err = capsys.readouterr()
    assert status == 0, out[-3000:] + err[-3000:]

    assert unrelated_trainer.poll() is None, "an unrelated python3 train.py was killed"
    assert foreign <= {p.pid for p in private_ray.processes()}, "the foreign Ray was touched"
    foreign_jobs = JobSubmissionClient(f"http://127.0.0.1:{private_ray.dashboard_port}")
    assert foreign_jobs.list_jobs() == [], "the job went to the foreign Ray"
    tag = RunTag(LAUNCHER_FILE, "cpu", "e2e")
    assert ownership.of_run(tag, ownership.processes()) == [], "this run's Ray was not stopped"
    (submitted,) = [line for line in err.splitlines() if line.startswith("==> step 5/6: ")]
    assert "RAY_AUTH_MODE=token" in submitted and "ray job submit" in submitted

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
