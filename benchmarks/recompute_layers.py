"""What recomputing fewer decoder layers saves the PEFT trainer's optimizer step, and what it
costs in memory (``--gradient-checkpointing-layers N``): the trainer as the GRPO benchmark runs
ours (`grpo_vs_trl.py`'s model and LoRA, r64 alpha 32 on all linear layers, bf16 on a GPU,
training the merged policy with its merged weights kept), built once per N in turn over the same
micro-batches (`--micro-batches` x `--micro-batch` rows of 256 prompt + `--response-len` tokens,
random ids, the loss the mean response log-probability). Reported per N: the median step time,
the peak memory torch allocated during a step, beside it what ``--colocate-memory auto``
estimates for that trainer (`trainer.job.memory_estimate`), and the step time against every
layer recomputed. `--profile` then runs one more step of each count under torch.profiler
(`step_profile`): the device's busy share of the step, its kernels, the longest ones (which
attention kernel PyTorch picked among them).

    python benchmarks/recompute_layers.py --shape qwen3-4b --response-len 8192 --micro-batch 1 \\
        --micro-batches 8 --layers=-1,24,12 --compile-layers --inputs ~/in-4b-8k   # one GPU
    python benchmarks/recompute_layers.py --shape qwen3-4b --response-len 8192 --micro-batch 1 \\
        --micro-batches 8 --layers=4 --compile-layers --profile   # where ours' train step goes
    python benchmarks/recompute_layers.py --device cpu --tiny --layers=-1,1,0   # seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.merged_training import (
    benchmark_trainer,
    mean_logprob_loss,
    micro_batches,
    timed_step,
)
from benchmarks.step_profile import StepProfile, profile_call
from benchmarks.workload import MODEL_SHAPES, Spec, prepare_inputs


def layer_counts(text: str) -> list[int]:
    """``--layers``: comma-separated counts of recomputed layers, -1 for every layer."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if any(count < -1 for count in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"each count once, -1 (every layer) or >= 0: {text!r}")
    return counts


def timed_steps(
    trainer: Any, batches: list[Any], steps: int, cuda: bool
) -> tuple[list[float], int]:
    """Step times after one warm-up step, and the peak bytes torch allocated in a step."""
    loss_fn = mean_logprob_loss(len(batches))
    times, peak = [], 0
    for step in range(steps + 1):
        seconds, step_peak = timed_step(trainer, batches, loss_fn, cuda)
        peak = max(peak, step_peak)
        if step:
            times.append(seconds)
    return times, peak


def profiled_step(trainer: Any, batches: list[Any], cuda: bool) -> dict[str, Any]:
    """One more step of `trainer` under torch.profiler, summarized (`step_profile`)."""
    loss_fn = mean_logprob_loss(len(batches))
    return asdict(profile_call(lambda: trainer.train_step(batches, loss_fn), cuda=cuda, top=12))


def estimated_bytes(spec: Spec, count: int, *, compiled: bool) -> int:
    """``--colocate-memory auto``'s estimate of the trainer that recomputes `count` layers (-1:
    every layer): train.py's own, for the argv of this trainer."""
    from trainer.arguments import parse_args
    from trainer.backends import registry
    from trainer.job import colocate_memory, model_shape

    config = parse_args([
        "--hf-checkpoint", spec.model_dir, "--prompt-data", spec.prompt_file,
        "--rollout-max-prompt-len", str(spec.prompt_len),
        "--rollout-max-response-len", str(spec.response_len),
        "--micro-batch-size", str(spec.micro_batch),
        "--lora-rank", "64", "--lora-alpha", "32", "--target-modules", "all-linear",
        "--lora-serving", "merged", "--dtype", "bf16" if spec.device == "cuda" else "fp32",
        "--gradient-checkpointing", "--gradient-checkpointing-layers", str(count),
        *(["--torch-compile-layers"] if compiled else []),
    ])  # fmt: skip
    targets = registry.adapter_targets(config).hf
    shape = model_shape.read(Path(spec.model_dir), lora_rank=64, lora_targets=targets)
    return colocate_memory.trainer_estimate(config, shape).total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny model of trainer/tiny.py")
    parser.add_argument("--shape", choices=tuple(MODEL_SHAPES), default="qwen3-4b")
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per count")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=1, help="rows per micro-batch")
    parser.add_argument(
        "--layers",
        type=layer_counts,
        default=[-1, 24, 12],
        help="recomputed decoder layers to compare, comma-separated; -1: every layer",
    )
    parser.add_argument("--compile-layers", action="store_true", help="each layer compiled")
    parser.add_argument(
        "--profile", action="store_true", help="profile one more step of each count"
    )
    parser.add_argument(
        "--inputs",
        type=Path,
        help="keep the random model here and reuse it (grpo_vs_trl.py's --inputs)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    options = parser.parse_args(argv)
    if min(options.steps, options.micro_batches, options.micro_batch, options.response_len) < 1:
        parser.error("--steps, --micro-batches, --micro-batch and --response-len must be >= 1")
    import torch

    cuda = options.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("recompute_layers: --device cuda, but torch sees no GPU (use --device cpu)")
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="recompute-layers-") as work:
        spec = Spec(
            work=work, device=options.device, tiny=options.tiny, prompts=1, samples=1,
            prompt_len=16 if options.tiny else 256, response_len=options.response_len,
            micro_batch=options.micro_batch, lr=2e-5, seed=42, rollout_backend="hf",
            shape=options.shape, inputs=str(options.inputs.resolve()) if options.inputs else "",
        )  # fmt: skip
        print(prepare_inputs(spec, rows=1), flush=True)
        batches = None
        for count in options.layers:
            trainer = benchmark_trainer(
                spec,
                options.steps + 1,
                gradient_checkpointing=True,
                checkpointed_layers=count,
                merged=True,
                compile_layers=options.compile_layers,
            )
            if batches is None:
                vocab = trainer.model.get_base_model().config.vocab_size
                batches = micro_batches(spec, options.micro_batches, vocab)
            times, peak = timed_steps(trainer, batches, options.steps, cuda)
            estimate = estimated_bytes(spec, count, compiled=options.compile_layers)
            results[count] = {"times": times, "peak": peak, "estimate": estimate}
            if options.profile:
                results[count]["profile"] = profiled_step(trainer, batches, cuda)
            del trainer
            gc.collect()
            torch._dynamo.reset()  # each count compiles its own layers in its warm-up step
            if cuda:
                torch.cuda.empty_cache()
    length = spec.prompt_len + spec.response_len
    print(
        f"{'tiny' if options.tiny else options.shape}, {options.device}, {options.micro_batches} "
        f"x {options.micro_batch} rows of {spec.prompt_len} + {spec.response_len} tokens "
        f"({options.micro_batches * options.micro_batch * length} per step), LoRA r64 "
        "all-linear, merged" + (", layers compiled" if options.compile_layers else "")
    )
    print(
        f"{'recomputed':<11} {'median s':>9} {'min s':>8} {'peak allocated GiB':>19} "
        f"{'estimate GiB':>13} {'vs all':>7}"
    )
    medians = {count: statistics.median(r["times"]) for count, r in results.items()}
    baseline = medians.get(-1)
    for count, result in results.items():
        peak = f"{result['peak'] / 2**30:.2f}" if cuda else "n/a"
        ratio = f"{medians[count] / baseline:.2f}x" if baseline else "n/a"
        label = "all" if count == -1 else str(count)
        estimate = f"{result['estimate'] / 2**30:.2f}"
        print(
            f"{label:<11} {medians[count]:>9.3f} {min(result['times']):>8.3f} {peak:>19} "
            f"{estimate:>13} {ratio:>7}"
        )
    if options.profile:
        print("one more step of each under torch.profiler (its overhead lengthens the host side):")
        for count, result in results.items():
            label = "all" if count == -1 else str(count)
            print("\n".join(StepProfile(**result["profile"]).lines(f"{label} recomputed")))
    if options.json:
        options.json.write_text(json.dumps({str(c): r for c, r in results.items()}, indent=1))


if __name__ == "__main__":
    main()
