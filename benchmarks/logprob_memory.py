"""Peak memory of the training log-probabilities of one long response, before and after
`trainer.grpo.logprobs` (chunked selective log-softmax).

One response of `--tokens` tokens: its hidden states ``[tokens, hidden]`` (requiring grad) go
through a frozen output layer ``[vocab, hidden]`` (LoRA leaves it frozen; Qwen3 ties it to the
embeddings) to the sampled tokens' log-probabilities and entropies; backward of their sum.
*before* is the trainer's former computation (full logits, float32 log-softmax, entropy from
the full float32 logits); *after* is `trainer.grpo.logprobs.token_logprobs`. Reported: peak memory
above the inputs (hidden states, output layer, targets) and the time of forward + backward.

On CUDA the peak is ``torch.cuda.max_memory_allocated``. On CPU each variant runs in a fresh
process and the peak is the growth of its resident set (``ru_maxrss``); the CPU default is 1,024
tokens (the 8,192-token naive computation needs about 25 GB).

    python benchmarks/logprob_memory.py --device cuda            # 8,192 tokens, vocab 151,936
    python benchmarks/logprob_memory.py --device cpu             # 1,024 tokens
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainer.grpo.logprob_chunks import DEFAULT_CHUNK_ROWS
from trainer.grpo.logprobs import token_logprobs
from trainer.grpo.loss import entropy_from_logits

VARIANTS = ("before", "after", "compiled")
MIB = 2**20


def naive(hidden, head, targets, temperature):
    """The former `PeftPolicyTrainer._forward` on one row of logits."""
    scaled = head(hidden).float() / temperature
    logprobs = scaled.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = entropy_from_logits(scaled)
    return logprobs, entropy


def chunked(hidden, head, targets, temperature, chunk_rows, compiled=False):
    return token_logprobs(
        hidden,
        targets,
        weight=head.weight,
        temperature=temperature,
        with_entropy=True,
        chunk_rows=chunk_rows,
        compiled=compiled,
    )


def rss_bytes() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def measure(variant: str, options: argparse.Namespace) -> tuple[float, float]:
    """(peak bytes above the inputs, median seconds) of a forward + backward, over
    `options.repeats` after `options.warmup` (a compiled variant compiles in its first)."""
    device = torch.device(options.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[options.dtype]
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(options.hidden, options.vocab, bias=False).to(device, dtype)
    head.requires_grad_(False)
    hidden = torch.randn(options.tokens, options.hidden, generator=generator).to(device, dtype)
    hidden.requires_grad_()
    targets = torch.randint(0, options.vocab, (options.tokens,), generator=generator).to(device)
    cuda = device.type == "cuda"
    base = rss_bytes()
    times = []
    for _ in range(options.warmup + options.repeats):
        hidden.grad = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        started = time.perf_counter()
        if variant == "before":
            logprobs, entropy = naive(hidden, head, targets, 1.0)
        else:
            compiled = variant == "compiled"
            logprobs, entropy = chunked(hidden, head, targets, 1.0, options.chunk_rows, compiled)
        (logprobs.sum() + 0.0 * entropy.sum()).backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
        del logprobs, entropy
    if cuda:
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return float(peak), statistics.median(times[options.warmup :])


def _child(variant: str, options: argparse.Namespace, queue) -> None:
    queue.put(measure(variant, options))


def isolated(variant: str, options: argparse.Namespace) -> tuple[float, float]:
    """`measure` in a fresh process: its resident-set peak belongs to this variant alone."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(variant, options, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, help="response length (8192 on CUDA, 1024 on CPU)")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), help="bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS)
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each variant")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median)")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}"
    )
    options = parser.parse_args(argv)
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: --device {options.device}: no CUDA device\n")
    options.variants = options.variants.split(",")
    if not set(options.variants) <= set(VARIANTS):
        parser.error(f"--variants: comma-separated of {', '.join(VARIANTS)}")
    if options.warmup < 0 or options.repeats < 1:
        parser.error("--warmup must be >= 0 and --repeats >= 1")
    cpu = options.device == "cpu"
    if options.tokens is None:
        options.tokens = 1024 if cpu else 8192
    if options.dtype is None:
        options.dtype = "fp32" if cpu else "bf16"  # CPU bf16 matrix products are very slow
    return options


def main(argv: list[str] | None = None) -> None:
    options = parse(argv)
    run = measure if options.device != "cpu" else isolated
    print(
        f"{options.tokens} tokens, vocab {options.vocab}, hidden {options.hidden}, "
        f"{options.dtype}, {options.device} (torch {torch.__version__}); peak above inputs"
    )
    results = {variant: run(variant, options) for variant in options.variants}
    for variant, (peak, seconds) in results.items():
        print(f"{variant:<8} peak {peak / MIB:10.1f} MiB   forward+backward {seconds:7.4f} s")
    if "before" in results and "after" in results:
        before, after = results["before"][0], results["after"][0]
        print(f"peak ratio before/after: {before / max(after, 1.0):.1f}x")
    if "after" in results and "compiled" in results:
        print(f"time after/compiled: {results['after'][1] / results['compiled'][1]:.2f}x")


if __name__ == "__main__":
    main()
