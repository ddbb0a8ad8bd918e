"""Live, on one NVIDIA GPU: the CUDA Qwen3-4B launcher's production job, shortened to fit.

The launcher's own ``train`` (cleanup, ``ray start``, ``ray job submit -- python3 train.py``)
runs SGLang rollout colocated with training on a locally built Qwen3 of about 0.6B parameters
(`trainer.tiny`'s ``qwen3-0.6b`` shape, random weights) and the tiny task, for 12 rollouts:
the adapter reaches the engine in memory after every update, and the engine's memory is
released and resumed around training. Checked: the job exits 0; the seed's health metric
(mean ``train_rollout_logprob_abs_diff``) is below 0.03; after each update the engine's
log-probs of a fixed sequence match the trainer's (``--check-adapter-sync``) while the adapter
has moved the policy by more than that; the step time splits into rollout, training and sync.

    pytest -m cuda_gpu tests/manual/test_cuda_production_one_gpu.py -s

Needs Ray and SGLang (an offline node gets them from a wheelhouse: docs/offline-nodes.md). The
trainer is Megatron-Bridge where it and Transformer Engine import, else PyTorch/PEFT. Both
SGLang backend pairs run: the AMD recipe's (Triton attention, Triton LoRA: the nearest stand-in
for an MI355X here) and the CUDA recipe's (FlashInfer attention, chunked-SGMV LoRA).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.hardware import match_hardware
from harness.host import CHECKOUT, detect_gpus
from trainer.metrics import METRICS_FILE, read_metrics

ROLLOUTS = 12
LOGPROB_DIFF_LIMIT = 0.03  # the seed's threshold for train_rollout_logprob_abs_diff
BACKENDS = {"amd-triton": ("triton", "triton"), "cuda-recipe": ("flashinfer", "csgmv")}
BREAKDOWN = ("rollout", "logprobs", "train", "export_adapter", "load_adapter", "step")


def _train_backend() -> str:
    bridge = importlib.util.find_spec("megatron") and importlib.util.find_spec("megatron.bridge")
    if bridge and importlib.util.find_spec("transformer_engine"):
        return "megatron"
    print("Megatron-Bridge or Transformer Engine is not importable: PyTorch/PEFT trains")
    return "torch"


@pytest.mark.cuda_gpu
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backends", list(BACKENDS))
def test_production_job_on_one_gpu(tmp_path: Path, backends: str) -> None:
    for module in ("ray", "sglang"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    found = match_hardware(detect_gpus() or "")
    if found is None or found.vendor != "nvidia":
        pytest.skip(f"needs an NVIDIA GPU the registry knows, found {found or 'no GPU'}")
    from trainer import tiny

    model = tmp_path / "models" / "qwen3-0.6b-tiny-task"
    data = tmp_path / "data" / "tiny-task"
    tiny.build(model, data, seed=0, shape="qwen3-0.6b")
    attention, lora = BACKENDS[backends]
    train_backend = _train_backend()
    extra = [
        "--prompt-data", str(data / "train.jsonl"), "--rm-type", "tiny",
        "--train-backend", train_backend, "--sglang-attention-backend", attention,
        "--sglang-lora-backend", lora, "--check-adapter-sync", "--save-interval", "1000",
        # A short run: no prefill CUDA graphs (80 s of capture at start-up on an H200).
        "--sglang-disable-prefill-cuda-graph",
    ]  # fmt: skip
    if train_backend == "torch":  # PEFT packs micro-batches by count (Megatron by tokens)
        extra += ["--micro-batch-size", "32"]
    command = [
        sys.executable, "-m", "launchers.run_qwen3_4b_lora", "train",
        "--hardware", found.name, "--num-gpus-per-node", "1",
        "--model-dir", str(tmp_path / "models"), "--model-name", model.name,
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--run-id", backends, "--num-rollout", str(ROLLOUTS),
        "--rollout-max-response-len", "64", "--lr", "1e-4", "--no-enable-eval",
        "--wandb-mode", "disabled", "--extra-args", " ".join(extra),
    ]  # fmt: skip
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp")}
    done = subprocess.run(command, cwd=CHECKOUT, env=env, capture_output=True, text=True)
    print(done.stdout[-8000:], done.stderr[-4000:], sep="\n")
    assert done.returncode == 0, done.stderr[-2000:]

    records = read_metrics(tmp_path / "outputs" / backends / METRICS_FILE)
    assert len(records) == ROLLOUTS
    health = statistics.mean(r["train/train_rollout_logprob_abs_diff"] for r in records)
    sync = [r["sync/engine_trainer_logprob_abs_diff"] for r in records[1:]]
    shift = [r["sync/adapter_shift"] for r in records[:-1]]
    medians = {
        name: statistics.median(r[f"time/{name}"] for r in records[1:] if f"time/{name}" in r)
        for name in BREAKDOWN
    }
    report = {
        "backends": backends,
        "train_rollout_logprob_abs_diff_mean": health,
        "sync_diff_max": max(sync),
        "adapter_shift_max": max(shift),
        "reward_first3": statistics.mean(r["rollout/reward_mean"] for r in records[:3]),
        "reward_last3": statistics.mean(r["rollout/reward_mean"] for r in records[-3:]),
        "median_s": medians,
    }
    print("RESULT " + json.dumps(report, sort_keys=True))
    assert health < LOGPROB_DIFF_LIMIT, report
    assert max(sync) < LOGPROB_DIFF_LIMIT, report
    assert max(shift) > 2 * LOGPROB_DIFF_LIMIT, report  # a stale adapter would be caught
