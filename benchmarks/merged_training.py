"""What training the merged policy costs the PEFT trainer (``--lora-serving merged``,
`trainer.backends.torch.merged_policy`) against training the adapter, side by side in one process:
the merged policy with its merged weights kept for the step (``merged``, the default) and merged
again in every pass (``merged-per-pass``, ``--no-keep-merged-weights``); with `--compile-layers`
also the merged policy with each decoder layer compiled (``merged-compiled``,
``--torch-compile-layers``: its compile happens in the warm-up step).

Two trainers of `grpo_vs_trl.py`'s model and LoRA (r64, alpha 32, all linear layers, bf16 on a
GPU) take turns at optimizer steps over the same micro-batches (`--micro-batches` x
`--micro-batch` rows of 256 prompt + 512 response tokens, random ids, the loss the mean
response log-probability). Reported per trainer: the median step time and the peak memory torch
allocated during a step; and whether the merged trainer's weights equal, bit for bit, what the
rollout engine merges from the same checkpoint and exported adapter (`lora_merge.LoraMerger`).
`--profile` then runs one more step of each under torch.profiler (`step_profile`): how long the
device computed of the step's wall time, how many kernels it launched, the longest kernels.

    python benchmarks/merged_training.py --profile            # one GPU
    python benchmarks/merged_training.py --shape qwen3-4b --micro-batch 4 --gradient-checkpointing
    python benchmarks/merged_training.py --device cpu --tiny  # seconds, this project's CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.step_profile import profile_call
from benchmarks.workload import MODEL_SHAPES, Spec, prepare_inputs

# the trainers compared, by name, with their PeftPolicyTrainer options
TRAINERS = {
    "adapter": {"merged": False},
    "merged": {"merged": True},
    "merged-per-pass": {"merged": True, "keep_merged_weights": False},
}


def trainer_options(compile_layers: bool) -> dict[str, dict[str, bool]]:
    """The trainers to run, by name, with their `PeftPolicyTrainer` options."""
    if not compile_layers:
        return TRAINERS
    return {**TRAINERS, "merged-compiled": {"merged": True, "compile_layers": True}}


def micro_batches(spec: Spec, count: int, vocab: int) -> list[Any]:
    import torch

    from trainer.backends.base import TrainBatch

    generator = torch.Generator().manual_seed(spec.seed)
    length = spec.prompt_len + spec.response_len
    batches = []
    for _ in range(count):
        ids = torch.randint(vocab, (spec.micro_batch, length), generator=generator)
        loss_mask = torch.zeros(spec.micro_batch, length - 1)
        loss_mask[:, spec.prompt_len - 1 :] = 1
        batches.append(TrainBatch(ids, torch.ones_like(ids), loss_mask))
    return batches


def mean_logprob_loss(count: int) -> Any:
    def loss_fn(out: Any, batch: Any) -> tuple[Any, dict[str, float]]:
        mask = batch.loss_mask.to(out.logprobs.device)
        return -(out.logprobs * mask).sum() / mask.sum() / count, {}

    return loss_fn


def benchmark_trainer(spec: Spec, steps: int, **options: Any) -> Any:
    """A PEFT trainer of `spec`'s model with `grpo_vs_trl.py`'s LoRA (r64, alpha 32, all linear
    layers), bf16 on a GPU, for `steps` optimizer steps; `options` go to `PeftPolicyTrainer`."""
    from trainer.backends.torch.trainer import PeftPolicyTrainer
    from trainer.config import LoraConfig, OptimizerConfig

    return PeftPolicyTrainer(
        spec.model_dir,
        LoraConfig(lora_rank=64, lora_alpha=32.0, target_modules="all-linear"),
        OptimizerConfig(lr=spec.lr),
        total_steps=steps,
        device=spec.device,
        dtype="bf16" if spec.device == "cuda" else "fp32",
        **options,
    )


def timed_step(trainer: Any, batches: list[Any], loss_fn: Any, cuda: bool) -> tuple[float, int]:
    """One optimizer step of `trainer`: its seconds and the peak bytes torch allocated in it
    (0 on the CPU)."""
    import torch

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    trainer.train_step(batches, loss_fn)
    if not cuda:
        return time.perf_counter() - started, 0
    torch.cuda.synchronize()
    return time.perf_counter() - started, torch.cuda.max_memory_allocated()


def merged_equals_engine(trainer: Any, model_dir: str, device: str) -> bool:
    """Every adapted weight the trainer computes with equals the engine's merge."""
    import torch

    from trainer.backends.lora_merge import LoraMerger

    merger = LoraMerger.from_checkpoint(model_dir, device=device, dtype=trainer.compute_dtype)
    served = merger.merge(trainer.export_adapter())
    computed = trainer.merged.served()
    return computed.keys() == set(served) and all(
        torch.equal(computed[name], weight) for name, weight in served.items()
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny model of trainer/tiny.py")
    parser.add_argument("--shape", choices=tuple(MODEL_SHAPES), default="qwen3-0.6b")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per trainer")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per micro-batch")
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute in backward (every trainer)",
    )
    parser.add_argument(
        "--compile-layers", action="store_true", help="also the merged trainer, layers compiled"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile one more step of each trainer"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    options = parser.parse_args(argv)
    if options.steps < 1 or options.micro_batches < 1 or options.micro_batch < 1:
        parser.error("--steps, --micro-batches and --micro-batch must be >= 1")
    import torch

    cuda = options.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("merged_training: --device cuda, but torch sees no GPU (use --device cpu)")
    with tempfile.TemporaryDirectory(prefix="merged-training-") as work:
        spec = Spec(
            work=work, device=options.device, tiny=options.tiny, prompts=1, samples=1,
            prompt_len=16 if options.tiny else 256, response_len=32 if options.tiny else 512,
            micro_batch=options.micro_batch, lr=2e-5, seed=42, rollout_backend="hf",
            shape=options.shape,
        )  # fmt: skip
        prepare_inputs(spec, rows=1)
        trainers = {
            name: benchmark_trainer(
                spec,
                options.steps + 1,
                gradient_checkpointing=options.gradient_checkpointing,
                **trainer_kwargs,
            )
            for name, trainer_kwargs in trainer_options(options.compile_layers).items()
        }
        vocab = trainers["adapter"].model.get_base_model().config.vocab_size
        batches = micro_batches(spec, options.micro_batches, vocab)
        loss_fn = mean_logprob_loss(len(batches))
        times: dict[str, list[float]] = {name: [] for name in trainers}
        peaks: dict[str, int] = dict.fromkeys(trainers, 0)
        for step in range(options.steps + 1):  # the first step warms up
            for name, trainer in trainers.items():
                seconds, peak = timed_step(trainer, batches, loss_fn, cuda)
                peaks[name] = max(peaks[name], peak)
                if step:
                    times[name].append(seconds)
        profiles = (
            {
                name: profile_call(lambda t=trainer: t.train_step(batches, loss_fn), cuda=cuda)
                for name, trainer in trainers.items()
            }
            if options.profile
            else {}
        )
        exact = merged_equals_engine(trainers["merged"], spec.model_dir, options.device)
    tokens = options.micro_batches * options.micro_batch * (spec.prompt_len + spec.response_len)
    print(
        f"{'tiny' if options.tiny else options.shape}, {options.device}, {options.micro_batches} "
        f"x {options.micro_batch} rows of {spec.prompt_len} + {spec.response_len} tokens "
        f"({tokens} per step), LoRA r64 all-linear"
        + (", gradient checkpointing" if options.gradient_checkpointing else "")
    )
    print(f"{'trainer':<15} {'median s':>9} {'min s':>8} {'peak allocated GiB':>19}")
    medians = {}
    for name in times:
        medians[name] = statistics.median(times[name])
        peak = f"{peaks[name] / 2**30:.2f}" if cuda else "n/a"
        print(f"{name:<15} {medians[name]:>9.3f} {min(times[name]):>8.3f} {peak:>19}")
    for name in list(times)[1:]:
        print(f"{name} / adapter step time: {medians[name] / medians['adapter']:.2f}x")
    print(f"merged weights equal the engine's merge bit for bit: {'yes' if exact else 'NO'}")
    if profiles:
        print("one more step of each under torch.profiler (its overhead lengthens the host side):")
    for name, profile in profiles.items():
        print("\n".join(profile.lines(name)))
    if options.json:
        results = {"times": times, "peaks": peaks, "exact": exact}
        results["profiles"] = {name: asdict(profile) for name, profile in profiles.items()}
        options.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
