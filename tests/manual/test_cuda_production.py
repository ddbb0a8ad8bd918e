"""Live, on NVIDIA GPUs: the CUDA Qwen3-4B launcher's production job, shortened to fit.

The launcher's own ``train`` (ownership claim, token-authenticated ``ray start``, ``ray job
submit -- python3 train.py``) runs SGLang rollout colocated with training, for each trainer
(Megatron-Bridge, as the recipe records it, and PyTorch/PEFT) and each SGLang backend pair (the
AMD recipe's Triton attention + Triton LoRA, the nearest stand-in for an MI355X here, and the
CUDA recipe's FlashInfer attention + chunked-SGMV LoRA).

`test_production_job_on_one_gpu`: `trainer.tiny`'s ``qwen3-0.6b`` shape (random weights) and
the tiny task for 12 rollouts, interrupted (as Ctrl-C) once the first checkpoint is on disk and
started again with the same ``--run-id``. Checked: the rerun resumes from that checkpoint and
exits 0, every step is logged once; the seed's health metric (mean
``train_rollout_logprob_abs_diff``) is below 0.03; after every update the engine serves the
trainer's adapter (``--check-adapter-sync``) while the adapter has moved the policy by more than
that; the adapter saved at the end, loaded into PEFT + transformers, gives the trainer's
log-probs (`trainer.run.adapter_check`); the step time splits into rollout, log-probs, train,
adapter export, adapter load and the swaps.

`test_seed_recipe_at_qwen3_4b_size`: the seed's values (8 prompts x 8 samples, LoRA r64/a32
on all linear layers, colocated, ``--lora-base-cpu-backup``, Triton attention and LoRA, SGLang
memory fraction 0.4) at the seed's 8,192-token response window on a Qwen3-4B-shaped model with
random weights (``qwen3-4b``: a random model that large almost never stops early, so every
response is that long), for 2 rollouts; reports peak device memory and the step split.

    pytest -m cuda_gpu tests/manual/test_cuda_production.py -s -k "megatron and cuda-recipe"

A job longer than one sitting (a node lent for 10 minutes at a time) runs as two commands on
one kept folder: the first run up to its interrupt, then the resume and the checks. The seed-size
run splits the same way, after its first rollout's checkpoint:

    pytest -m cuda_gpu tests/manual/test_cuda_production.py -s -k "merged and not kept" \
        --gpu-run-dir ~/gpu-runs --gpu-run-phase first
    pytest -m cuda_gpu tests/manual/test_cuda_production.py -s -k "merged and not kept" \
        --gpu-run-dir ~/gpu-runs --gpu-run-phase resume

(``-k kept``: the merged job with both resident, its engine merging into the trainer's base;
``-k swapped``: the same base lent with only SGLang's KV cache and graphs swapped. On a fresh
node, where FlashInfer compiles, each takes longer than 500 s in one command, so it splits the
same way.)

Output streams as the run goes (`tests/manual/live_run.py`); each run has a time budget and a
failure says what it was waiting for. `test_data_parallel_on_two_gpus` runs the job with two
training ranks (NCCL) and two colocated engines on a node with two or more GPUs.

Needs Ray and SGLang; the Megatron cases also Megatron-Bridge and Transformer Engine (an offline
node gets them from wheelhouses: docs/offline-nodes.md). A case whose stack is missing skips
with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.hardware import match_hardware
from harness.host import CHECKOUT, detect_gpus
from tests.manual.live_run import Finished, as_settings, run_streaming
from trainer.backends import shared_base
from trainer.run import adapter_check, checkpoint
from trainer.run.metrics import METRICS_FILE, read_metrics

ROLLOUTS = 12
SAVE_INTERVAL = 4
LOGPROB_DIFF_LIMIT = 0.03  # the seed's threshold for train_rollout_logprob_abs_diff
BACKENDS = {"amd-triton": ("triton", "triton"), "cuda-recipe": ("flashinfer", "csgmv")}
TRAINERS = ("megatron", "torch")
SWAPS = (
    "trainer_release_memory", "engine_resume_weights", "engine_resume_memory",
    "engine_release_memory", "trainer_resume_memory",
)  # fmt: skip
DECODE_GRAPHS = ("--sglang-cuda-graph-max-bs-decode", "64")  # 8 prompts x 8 samples
BREAKDOWN = ("rollout", "logprobs", "train", "export_adapter", "load_adapter", *SWAPS, "step")


@dataclass(frozen=True)
class RunPlace:
    """Where a production job runs (``--gpu-run-dir``, else the test's temporary folder) and
    which part of it this command runs (``--gpu-run-phase``: whole, first or resume).

    In a kept folder the job's HOME is ``DIR/home`` too: FlashInfer's and Triton's compiled
    kernels (``~/.cache/flashinfer``, ``~/.triton``) outlive the command, so a resume, or the
    next case in the same folder, does not compile them again (2-3 minutes on a fresh node).
    Otherwise the job has the test session's HOME, shared by the session's cases."""

    folder: Path
    phase: str
    kept: bool = False

    def env(self) -> dict[str, str]:
        """The launcher's environment: Ray's temporary folder of its own, HOME as above."""
        env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rt", dir="/tmp")}
        if self.kept:
            (home := self.folder / "home").mkdir(mode=0o700, exist_ok=True)
            env["HOME"] = str(home)
        return env


@pytest.fixture
def place(request: pytest.FixtureRequest, tmp_path: Path) -> RunPlace:
    folder, phase = (request.config.getoption(f"--gpu-run-{name}") for name in ("dir", "phase"))
    if phase != "whole" and folder is None:
        pytest.fail(f"--gpu-run-phase {phase} needs --gpu-run-dir DIR (the same DIR for both)")
    if folder is None:
        return RunPlace(tmp_path, phase)
    return RunPlace(Path(folder).expanduser().resolve(), phase, kept=True)


def _micro_batches(train_backend: str, gpus: int) -> list[str]:
    """Megatron packs rows under a token budget; PEFT counts rows (64 samples per update)."""
    if train_backend == "megatron":
        return ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "16384"]
    return ["--micro-batch-size", str(32 // gpus)]


def _skip_without_production_stack(gpus: int, train_backend: str) -> str:
    """The GPU model's registry name; skips where the stack or `gpus` NVIDIA GPUs are missing."""
    needed = ["ray", "sglang"]
    if train_backend == "megatron":
        needed += ["megatron.core", "megatron.bridge", "transformer_engine"]
    for module in needed:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            found = None
        if found is None:
            pytest.skip(f"{module} is not installed ({train_backend} trainer)")
    found = match_hardware(detect_gpus() or "")
    if found is None or found.vendor != "nvidia":
        pytest.skip(f"needs an NVIDIA GPU the registry knows, found {found or 'no GPU'}")
    import torch

    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} GPUs, found {torch.cuda.device_count()}")
    return found.name


class PeakGpuMemory:
    """The highest memory in use on the node's GPUs while it runs (nvidia-smi every second):
    every process's, the engines' included."""

    def __init__(self) -> None:
        self.peak_mib = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        import subprocess

        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._done.wait(1.0):
            done = subprocess.run(query, capture_output=True, text=True, check=False)
            used = [int(v) for v in done.stdout.split() if v.isdigit()]
            self.peak_mib = max([self.peak_mib, *used])

    def __enter__(self) -> PeakGpuMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def _launcher_command(
    tmp_path: Path,
    hardware: str,
    model: Path,
    *,
    gpus: int,
    run_id: str,
    launcher_flags: list[str],
    extra: list[str],
) -> list[str]:
    return [
        sys.executable, "-m", "launchers.run_qwen3_4b_lora", "train",
        "--hardware", hardware, "--num-gpus-per-node", str(gpus),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--run-id", run_id, "--wandb-mode", "disabled", "--extra-env", "NCCL_NVLS_ENABLE=0",
        *as_settings(["--hf-checkpoint", str(model), "--eval-interval", "", "--eval-prompt-data",
                      "", *launcher_flags, *extra]),
    ]  # fmt: skip


def _step_split(records: list[dict]) -> dict[str, float]:
    """Median seconds of each phase over the steps after the first (compiles, warm-up)."""
    later = records[1:] or records
    return {
        name: statistics.median(r[f"time/{name}"] for r in later if f"time/{name}" in r)
        for name in BREAKDOWN
        if any(f"time/{name}" in r for r in later)
    }


def _interrupted_run(
    place: RunPlace, command: list[str], run_id: str, *, rollouts: int, at: int
) -> int:
    """The job's first run, interrupted (as Ctrl-C) once its checkpoint of rollout `at` is on
    disk; returns the iteration it holds. With ``--gpu-run-phase resume``, the checkpoint that
    the earlier command's first run left."""
    saved = place.folder / "outputs" / run_id / "checkpoints"
    if place.phase == "resume":
        if (killed_at := checkpoint.latest_iteration(saved)) is None:
            pytest.fail(f"no checkpoint in {saved}: run --gpu-run-phase first with this DIR")
        return killed_at
    if saved.parent.exists():
        pytest.fail(f"{saved.parent} holds an earlier run: remove it or name another DIR")
    first = run_streaming(
        command, label=f"{run_id} (first run)", budget_s=1200, cwd=CHECKOUT, env=place.env(),
        log=place.folder / f"{run_id}.log",
        interrupt_when=lambda: (checkpoint.latest_iteration(saved) or 0) >= at,
    )  # fmt: skip
    assert first.interrupted, f"the first run ended ({first.returncode}) before its checkpoint"
    assert first.returncode == 130, first.output[-3000:]
    killed_at = checkpoint.latest_iteration(saved)
    assert killed_at is not None and killed_at < rollouts
    if place.phase == "first":
        print(f"FIRST RUN interrupted at checkpoint {killed_at} of {rollouts}; resume it with "
              f"--gpu-run-phase resume --gpu-run-dir {place.folder}", flush=True)  # fmt: skip
    return killed_at


def _resumed_run(
    place: RunPlace, command: list[str], run_id: str, killed_at: int, *, rollouts: int
) -> Finished:
    """The same launch again: it resumes from the checkpoint of rollout `killed_at` and ends."""
    saved = place.folder / "outputs" / run_id / "checkpoints"
    second = run_streaming(
        command, label=f"{run_id} (resumed)", budget_s=1200, cwd=CHECKOUT, env=place.env(),
        log=place.folder / f"{run_id}.log",
    )  # fmt: skip
    assert second.returncode == 0, second.output[-3000:]
    resumed = f"resumed from {checkpoint.iter_dir(saved, killed_at)}"
    assert f"{resumed} (next rollout {killed_at + 1}/{rollouts})" in second.output
    return second


# ``--colocate-memory`` and the base's host backup: the recipe's (as recorded: released, the
# base backed up), both resident, or only the engine's KV cache and CUDA graphs released
MEMORY = {
    "recipe": [],
    "kept": ["--colocate-memory", "keep", "--lora-base-cpu-backup", "false"],
    "kv-swapped": ["--colocate-memory", "release", "--lora-base-cpu-backup", "false"],
}


def _run_job(
    place: RunPlace,
    hardware: str,
    *,
    gpus: int,
    train_backend: str,
    backends: str,
    rollouts: int,
    serving: str = "adapter",
    memory: str = "recipe",
) -> tuple[list[dict], dict]:
    """The launcher's live train on `gpus` GPUs, interrupted after its first checkpoint and
    resumed; returns the metrics and a report (nothing after ``--gpu-run-phase first``).
    `serving`: ``--lora-serving``; merged, the trainer's policy is the bf16-merged one, which
    PEFT applying the saved adapter unmerged matches only up to that rounding (docs/lora.md):
    reported, not asserted. `memory`: a key of `MEMORY`, the recipe's swaps or, without its
    ``--lora-base-cpu-backup``, both resident or the engine's KV cache alone swapped."""
    from trainer import tiny

    folder = place.folder
    model = folder / "models" / "qwen3-0.6b-tiny-task"
    if not model.is_dir():
        tiny.build(model, folder / "data", seed=0, shape="qwen3-0.6b", device="cuda")
    attention, lora = BACKENDS[backends]
    extra = [
        "--prompt-data", str(folder / "data" / "train.jsonl"), "--rm-type", "tiny",
        "--train-backend", train_backend, "--sglang-attention-backend", attention,
        "--sglang-lora-backend", lora, "--check-adapter-sync", "--lora-serving", serving,
        # A short run: no prefill CUDA graphs (80 s of capture at start-up on an H200), and
        # decode graphs only up to the rollout's 64 samples (SGLang's default on an H200 took
        # 36 batch sizes, 97 s, at each of the two starts).
        "--sglang-disable-prefill-cuda-graph", *DECODE_GRAPHS, *_micro_batches(train_backend, gpus),
    ]  # fmt: skip
    extra += MEMORY[memory]
    run_id = f"{train_backend}-{backends}-{gpus}gpu-{serving}"
    run_id += "" if memory == "recipe" else f"-{memory}"
    flags = [
        "--num-rollout", str(rollouts), "--save-interval", str(SAVE_INTERVAL),
        "--rollout-max-response-len", "64", "--lr", "1e-4",
    ]  # fmt: skip
    command = _launcher_command(
        folder, hardware, model, gpus=gpus, run_id=run_id, launcher_flags=flags, extra=extra
    )
    run_dir = folder / "outputs" / run_id
    saved = run_dir / "checkpoints"
    killed_at = _interrupted_run(place, command, run_id, rollouts=rollouts, at=SAVE_INTERVAL)
    if place.phase == "first":
        return [], {}
    second = _resumed_run(place, command, run_id, killed_at, rollouts=rollouts)
    assert f"{gpus} training rank(s), {gpus} sglang engine(s), colocated" in second.output
    if memory != "recipe" and serving == "merged" and train_backend == "torch" and gpus == 1:
        assert shared_base.LENT in second.output

    records = read_metrics(run_dir / METRICS_FILE)
    assert [r["step"] for r in records] == list(range(rollouts))  # none lost, none repeated

    final = checkpoint.iter_dir(saved, rollouts) / checkpoint.ADAPTER_DIR
    check = adapter_check.read(final)
    peft, without = adapter_check.peft_logprobs(final, check, device="cuda", dtype="bf16")
    report = {
        "train_backend": train_backend,
        "backends": backends,
        "serving": serving,
        "gpus": gpus,
        "resumed_from": killed_at,
        "train_rollout_logprob_abs_diff_mean": statistics.mean(
            r["train/train_rollout_logprob_abs_diff"] for r in records
        ),
        "sync_diff_max": max(r["sync/engine_trainer_logprob_abs_diff"] for r in records[1:]),
        "adapter_shift_max": max(r["sync/adapter_shift"] for r in records[:-1]),
        "ranks_off_rank0_adapter": max(r["sync/ranks_off_rank0_adapter"] for r in records),
        "peft_vs_trainer": adapter_check.mean_abs_diff(peft, check.logprobs),
        "peft_adapter_shift": adapter_check.mean_abs_diff(peft, without),
        "skipped_steps": sum(r.get("train/skipped_step", 0.0) for r in records),
        "reward_first3": statistics.mean(r["rollout/reward_mean"] for r in records[:3]),
        "reward_last3": statistics.mean(r["rollout/reward_mean"] for r in records[-3:]),
        "median_s": _step_split(records),
    }
    print("RESULT " + json.dumps(report, sort_keys=True), flush=True)
    assert report["train_rollout_logprob_abs_diff_mean"] < LOGPROB_DIFF_LIMIT, report
    assert report["sync_diff_max"] < LOGPROB_DIFF_LIMIT, report  # every engine, every update
    assert report["adapter_shift_max"] > 2 * LOGPROB_DIFF_LIMIT, report  # stale would show
    assert report["ranks_off_rank0_adapter"] == 0, report
    if serving == "adapter":
        assert report["peft_vs_trainer"] < LOGPROB_DIFF_LIMIT, report
    assert report["peft_adapter_shift"] > 2 * LOGPROB_DIFF_LIMIT, report
    assert report["skipped_steps"] == 0, report
    return records, report


@pytest.mark.cuda_gpu
@pytest.mark.timeout(3000)
@pytest.mark.parametrize("backends", list(BACKENDS))
@pytest.mark.parametrize("train_backend", TRAINERS)
def test_production_job_on_one_gpu(place: RunPlace, train_backend: str, backends: str) -> None:
    hardware = _skip_without_production_stack(1, train_backend)
    _run_job(
        place, hardware, gpus=1, train_backend=train_backend, backends=backends,
        rollouts=ROLLOUTS,
    )  # fmt: skip


@pytest.mark.cuda_gpu
@pytest.mark.timeout(3000)
def test_production_job_serving_merged_weights(place: RunPlace) -> None:
    """The same job with ``--lora-serving merged`` (PyTorch/PEFT trainer, the CUDA recipe's
    FlashInfer attention, as the benchmark runs it): SGLang without LoRA, each update merged
    into the base's linear weights in the engine's actor and sent over CUDA IPC, the trainer
    computing through the same merged weights. Checked as above, the engine-trainer agreement
    included; PEFT's unmerged reading of the saved adapter is reported (it differs from the
    merged policy by the bf16 rounding)."""
    hardware = _skip_without_production_stack(1, "torch")
    _run_job(
        place, hardware, gpus=1, train_backend="torch", backends="cuda-recipe",
        rollouts=ROLLOUTS, serving="merged",
    )  # fmt: skip


@pytest.mark.cuda_gpu
@pytest.mark.timeout(3000)
def test_production_job_serving_merged_weights_with_memory_kept(place: RunPlace) -> None:
    """The merged job with both resident (``--colocate-memory keep``): the engine's actor
    merges into the trainer's base weights, mapped from the trainer's actor over CUDA IPC
    (`trainer.backends.shared_base`) instead of a copy of its own; the sync check shows the
    engine serves what the trainer computes."""
    hardware = _skip_without_production_stack(1, "torch")
    _run_job(
        place, hardware, gpus=1, train_backend="torch", backends="cuda-recipe",
        rollouts=ROLLOUTS, serving="merged", memory="kept",
    )  # fmt: skip


@pytest.mark.cuda_gpu
@pytest.mark.timeout(3000)
def test_production_job_with_the_lent_base_and_the_kv_cache_swapped(place: RunPlace) -> None:
    """The merged job swapped without the base's host backup (``--colocate-memory release
    --lora-base-cpu-backup false``): SGLang gives back its KV cache and CUDA graphs alone for
    training, under its memory saver, and merges into the trainer's base, which stays on the
    GPU, as where both are kept."""
    hardware = _skip_without_production_stack(1, "torch")
    _run_job(
        place, hardware, gpus=1, train_backend="torch", backends="cuda-recipe",
        rollouts=ROLLOUTS, serving="merged", memory="kv-swapped",
    )  # fmt: skip


# What fits the seed's 8,192-token responses on one GPU next to SGLang's 0.4: Megatron packs
# rows under a token budget (one response per micro-batch) and recomputes each layer's
# activations in backward; PEFT takes one row per micro-batch with gradient checkpointing.
SEED_SIZE_TRAINING = {
    "megatron": [
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
        "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1",
    ],
    "torch": ["--micro-batch-size", "1", "--gradient-checkpointing"],
}  # fmt: skip


@pytest.mark.cuda_gpu
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("train_backend", TRAINERS)
def test_seed_recipe_at_qwen3_4b_size(place: RunPlace, train_backend: str) -> None:
    from trainer import tiny

    hardware = _skip_without_production_stack(1, train_backend)
    folder = place.folder
    model = folder / "models" / "qwen3-4b-random"
    if not model.is_dir():
        tiny.build(model, folder / "data", seed=0, shape="qwen3-4b", device="cuda")
    extra = [
        "--prompt-data", str(folder / "data" / "train.jsonl"),
        "--custom-rm-path", "trainer.tiny.length_parity", "--train-backend", train_backend,
        "--sglang-attention-backend", "triton", "--sglang-lora-backend", "triton",
        # Two rollouts: capturing prefill CUDA graphs costs more than it saves.
        "--sglang-disable-prefill-cuda-graph", *DECODE_GRAPHS, *SEED_SIZE_TRAINING[train_backend],
    ]  # fmt: skip
    run_id = f"seed-size-{train_backend}"
    # A checkpoint after each rollout: split in two commands, the second resumes from the first.
    command = _launcher_command(
        folder, hardware, model, gpus=1, run_id=run_id,
        launcher_flags=["--num-rollout", "2", "--save-interval", "1"], extra=extra,
    )  # fmt: skip
    with PeakGpuMemory() as memory:
        if place.phase == "whole":
            done = run_streaming(
                command, label=run_id, budget_s=3000, cwd=CHECKOUT, env=place.env(),
                log=folder / f"{run_id}.log",
            )  # fmt: skip
            assert done.returncode == 0, done.output[-3000:]
        else:
            killed_at = _interrupted_run(place, command, run_id, rollouts=2, at=1)
            if place.phase == "resume":
                _resumed_run(place, command, run_id, killed_at, rollouts=2)
    print(f"PEAK {memory.peak_mib / 1024:.1f} GiB of device memory ({place.phase})", flush=True)
    if place.phase == "first":
        return
    records = read_metrics(folder / "outputs" / run_id / METRICS_FILE)
    assert len(records) == 2
    report = {
        "train_backend": train_backend,
        "peak_gpu_memory_gib": round(memory.peak_mib / 1024, 1),
        "response_len_mean": statistics.mean(r["rollout/response_len_mean"] for r in records),
        "truncated_ratio": [r["rollout/truncated_ratio"] for r in records],
        "train_rollout_logprob_abs_diff": [
            r["train/train_rollout_logprob_abs_diff"] for r in records
        ],
        "step_s": [
            {name: r[f"time/{name}"] for name in BREAKDOWN if f"time/{name}" in r} for r in records
        ],
    }
    print("RESULT " + json.dumps(report, sort_keys=True), flush=True)
    # The seed's window, really used: most responses of each rollout run into the 8,192-token
    # limit (a random model stops early now and then: 5-6% of them did, a mean of 7,900).
    assert min(report["truncated_ratio"]) > 0.5, report


@pytest.mark.cuda_gpu
@pytest.mark.timeout(3600)
def test_data_parallel_on_two_gpus(tmp_path: Path) -> None:
    """Two ranks over NCCL and two engines against the same job on one GPU: the same global
    batch, so the ideal step time halves (efficiency = one-GPU step / (2 x two-GPU step))."""
    hardware = _skip_without_production_stack(2, "torch")
    place = RunPlace(tmp_path, "whole")  # two jobs side by side: not split
    _, one = _run_job(
        place, hardware, gpus=1, train_backend="torch", backends="amd-triton", rollouts=6
    )
    _, two = _run_job(
        place, hardware, gpus=2, train_backend="torch", backends="amd-triton", rollouts=6
    )
    single, double = one["median_s"]["step"], two["median_s"]["step"]
    print(
        f"SCALING step {single:.2f} s on 1 GPU, {double:.2f} s on 2 GPUs: "
        f"speed-up {single / double:.2f}x, efficiency {single / (2 * double):.0%}"
    )
