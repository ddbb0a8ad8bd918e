"""The CPU launcher's full-train, live and unaided: Ray started under a run tag, the real GRPO
LoRA job submitted, that Ray stopped again, and nothing else on the node touched.

A foreign Ray (tests/support/private_ray.py) and an unrelated process named ``python3 train.py`` run
beside it, as other users' would on a shared node; both must survive the run.

It runs as on a node without internet: its inputs come from a bundle made here first
(``python -m harness.bundle make``: the recipe's `prepare` builds them), with the Hub clients
offline (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``, ``HF_DATASETS_OFFLINE``) and a HOME of
its own, empty (no Hub cache, no Ray or pip state).
"""

from __future__ import annotations

import json
import subprocess
import sys
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

LAUNCHER_MODULE = "launchers.cpu.run_tiny_qwen3_lora"
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


def make_bundle(folder: Path) -> None:
    """The CPU recipe's bundle, made as a user makes one (its own process)."""
    command = [sys.executable, "-m", "harness.bundle", "make", LAUNCHER_MODULE, str(folder)]
    done = subprocess.run(command, cwd=CHECKOUT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_cpu_launcher_full_train_from_a_bundle_runs_offline_and_the_reward_rises(
    private_ray, unrelated_trainer, tmp_path, capsys, monkeypatch
):
    from ray.job_submission import JobSubmissionClient

    from harness.cli import run
    from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER

    bundle = tmp_path / "bundle"
    make_bundle(bundle)
    home = tmp_path / "fresh-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("HF_HOME", "HF_HUB_CACHE", "XDG_CACHE_HOME"):  # no cache of the user's
        monkeypatch.delenv(name, raising=False)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "1")
    private_ray.start_head()
    foreign = {p.pid for p in private_ray.processes()}
    assert foreign
    argv = [
        "full-train", "--run-id", "e2e", "--from-bundle", str(bundle),
        "--output-dir", str(tmp_path / "outputs"), *LauncherPorts.draw().argv(),
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
    step, checked = err.splitlines()[:2]  # the bundle checked first (a step's line is cut)
    assert step.startswith("==> step 1/6: cd ") and "python3 -m harness.bundle verify" in step
    assert checked == f"==> bundle {bundle}: 8 files as its manifest says"
    (submitted,) = [line for line in err.splitlines() if line.startswith("==> step 5/6: ")]
    assert "RAY_AUTH_MODE=token" in submitted and "ray job submit" in submitted
    # the capability check, in the launcher before its claim and in train.py before ray.init
    assert out.count("capability peft.LoraConfig: ok (peft ") == 2, out[-3000:]

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

    base = AutoModelForCausalLM.from_pretrained(bundle / "models" / "tiny-qwen3")
    model = PeftModel.from_pretrained(base, adapter)
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b and any(float(p.abs().sum()) > 0 for p in lora_b)
    refuses_a_damaged_file(bundle, capsys)
    print(
        f"e2e: {elapsed:.1f} s, reward {summary['reward_first5']:.3f} -> "
        f"{summary['reward_last5']:.3f}, {summary['mean_step_s']:.2f} s/step"
    )


def refuses_a_damaged_file(bundle: Path, capsys) -> None:
    """A byte of the bundle's model flipped: its prepare is one line, exit 2, nothing run."""
    from harness.cli import run
    from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER

    weights = bundle / "models" / "tiny-qwen3" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    capsys.readouterr()  # what the test printed so far
    status = run(LAUNCHER, ["prepare", "--from-bundle", str(bundle)])
    out, err = capsys.readouterr()
    assert status == 2 and not out
    (line,) = err.splitlines()
    assert line.startswith(f"python -m {LAUNCHER_MODULE}: error: --from-bundle: bundle {bundle}: ")
    assert "models/tiny-qwen3/model.safetensors is damaged" in line
