"""Live, on NVIDIA GPUs: the CUDA Qwen3-4B launcher's production job, shortened to fit.

The launcher's own ``train`` (cleanup, ``ray start``, ``ray job submit -- python3 train.py``)
runs SGLang rollout colocated with training on a locally built Qwen3 of about 0.6B parameters
(`trainer.tiny`'s ``qwen3-0.6b`` shape, random weights) and the tiny task, for 12 rollouts:
the adapter reaches the engine in memory after every update, and the engine's memory is
released and resumed around training. Checked: the job exits 0; the seed's health metric
(mean ``train_rollout_logprob_abs_diff``) is below 0.03; after each update the engine's
log-probs of a fixed sequence match the trainer's (``--check-adapter-sync``) while the adapter
has moved the policy by more than that; the step time splits into rollout, training and sync.

    pytest -m cuda_gpu tests/manual/test_cuda_production.py -s

On a node with two or more GPUs, `test_data_parallel_on_two_gpus` runs the same job with two
training ranks (NCCL) and two colocated engines, checks that both ranks hold the same adapter
after every update and that each engine serves it, and reports the step time against one GPU.

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


def _skip_without_production_stack(gpus: int) -> str:
    """The GPU model's registry name; skips where Ray, SGLang or `gpus` NVIDIA GPUs are missing."""
    for module in ("ray", "sglang"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    found = match_hardware(detect_gpus() or "")
    if found is None or found.vendor != "nvidia":
        pytest.skip(f"needs an NVIDIA GPU the registry knows, found {found or 'no GPU'}")
    import torch

    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs, found {torch.cuda.device_count()}")
    return found.name


def _run_job(
    tmp_path: Path, hardware: str, *, gpus: int, backends: str, rollouts: int
) -> tuple[list[dict], dict]:
    """The launcher's live train on `gpus` GPUs; returns the metrics and a report."""
    from trainer import tiny

    model = tmp_path / "models" / "qwen3-0.6b-tiny-task"
    data = tmp_path / "data" / "tiny-task"
    if not model.is_dir():
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
        extra += ["--micro-batch-size", str(32 // gpus)]
    run_id = f"{backends}-{gpus}gpu"
    command = [
        sys.executable, "-m", "launchers.run_qwen3_4b_lora", "train",
        "--hardware", hardware, "--num-gpus-per-node", str(gpus),
        "--model-dir", str(tmp_path / "models"), "--model-name", model.name,
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--run-id", run_id, "--num-rollout", str(rollouts),
        "--rollout-max-response-len", "64", "--lr", "1e-4", "--no-enable-eval",
        "--wandb-mode", "disabled", "--extra-env", "NCCL_NVLS_ENABLE=0",
        "--extra-args", " ".join(extra),
    ]  # fmt: skip
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp")}
    done = subprocess.run(command, cwd=CHECKOUT, env=env, capture_output=True, text=True)
    print(done.stdout[-8000:], done.stderr[-4000:], sep="\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{gpus} training rank(s), {gpus} sglang engine(s), colocated" in done.stdout

    records = read_metrics(tmp_path / "outputs" / run_id / METRICS_FILE)
    assert len(records) == rollouts
    report = {
        "backends": backends,
        "gpus": gpus,
        "train_rollout_logprob_abs_diff_mean": statistics.mean(
            r["train/train_rollout_logprob_abs_diff"] for r in records
        ),
        "sync_diff_max": max(r["sync/engine_trainer_logprob_abs_diff"] for r in records[1:]),
        "adapter_shift_max": max(r["sync/adapter_shift"] for r in records[:-1]),
        "ranks_off_rank0_adapter": max(r["sync/ranks_off_rank0_adapter"] for r in records),
        "reward_first3": statistics.mean(r["rollout/reward_mean"] for r in records[:3]),
        "reward_last3": statistics.mean(r["rollout/reward_mean"] for r in records[-3:]),
        "median_s": {
            name: statistics.median(r[f"time/{name}"] for r in records[1:] if f"time/{name}" in r)
            for name in BREAKDOWN
        },
    }
    print("RESULT " + json.dumps(report, sort_keys=True))
    assert report["train_rollout_logprob_abs_diff_mean"] < LOGPROB_DIFF_LIMIT, report
    assert report["sync_diff_max"] < LOGPROB_DIFF_LIMIT, report  # every engine, every update
    assert report["adapter_shift_max"] > 2 * LOGPROB_DIFF_LIMIT, report  # stale would show
    assert report["ranks_off_rank0_adapter"] == 0, report
    return records, report


@pytest.mark.cuda_gpu
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backends", list(BACKENDS))
def test_production_job_on_one_gpu(tmp_path: Path, backends: str) -> None:
    hardware = _skip_without_production_stack(1)
    _run_job(tmp_path, hardware, gpus=1, backends=backends, rollouts=ROLLOUTS)


@pytest.mark.cuda_gpu
@pytest.mark.timeout(2400)
def test_data_parallel_on_two_gpus(tmp_path: Path) -> None:
    """Two ranks over NCCL and two engines against the same job on one GPU: the same global
    batch, so the ideal step time halves (efficiency = one-GPU step / (2 x two-GPU step))."""
    hardware = _skip_without_production_stack(2)
    _, one = _run_job(tmp_path, hardware, gpus=1, backends="amd-triton", rollouts=6)
    _, two = _run_job(tmp_path, hardware, gpus=2, backends="amd-triton", rollouts=6)
    single, double = one["median_s"]["step"], two["median_s"]["step"]
    print(
        f"SCALING step {single:.2f} s on 1 GPU, {double:.2f} s on 2 GPUs: "
        f"speed-up {single / double:.2f}x, efficiency {single / (2 * double):.0%}"
    )
