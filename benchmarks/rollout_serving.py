"""Rollout throughput of ours' SGLang engine per way of serving the LoRA policy, with and
without per-request seeds, on `grpo_vs_trl.py`'s workload.

* *adapter* (`--lora-serving adapter`, the default): the engine serves the base with the adapter
  through SGLang's LoRA kernels; an update loads the adapter (77 MiB at the 0.6B shape).
* *merged* (`--lora-serving merged`): the adapter is merged into the base's linear weights
  (`trainer.backends.lora_merge`) and those replace the engine's through
  ``update_weights_from_tensor``; decoding runs no LoRA kernels.

Per-request seeds (the default, the determinism contract) make SGLang sample each token with its
seeded Gumbel sampler over the vocabulary; `--no-rollout-request-seeds` leaves it
``torch.multinomial``. Each way of serving gets its own engine, in its own process, with the
benchmark's SGLang settings (`grpo_vs_trl.ours_config`, memory kept, `--ours-flags` added); one
random adapter (r64, all linear layers) is loaded `--repeats` + 1 times, then 8 prompts x 8
samples x 512 tokens are generated once to warm up and `--repeats` times each with and without
seeds, alternating. Reported: rollout tokens/s (generated tokens over the generate call, prefill
included), its share of the decode bound of `grpo_vs_trl.py` (weights, LoRA and KV cache read
once per decode step; the merged engine reads no LoRA weights, but the bound keeps them, so the
shares compare), and the median time of one update (merge or adapter, hand-over, SGLang's load).

    python benchmarks/rollout_serving.py                       # adapter and merged, H200
    python benchmarks/rollout_serving.py --serving adapter --ours-flags=--sglang-lora-backend=csgmv
    python benchmarks/rollout_serving.py --serving merged \
      --ours-flags='--sglang-attention-backend flashinfer' --variant base= \
      --variant compile='--sglang-enable-torch-compile --sglang-torch-compile-max-bs 64'

Each `--variant NAME=FLAGS` measures every serving once more with those flags added, in its own
engine process, after one model build: side by side in one run. `--profile` adds one more
seeded generate call per engine under SGLang's profiler (GPU activity only), and reports how
long the GPU was busy of that call's wall time, how many kernels ran and the longest ones
(`step_profile`): a low share means decoding waits on the host (SGLang's scheduler), not on
the GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_bound import bound_bandwidth, count_params, decode_bound, projection_shapes
from benchmarks.ours_system import device_memory, ours_config, sglang_flags
from benchmarks.step_profile import StepProfile, profile_traces
from benchmarks.workload import MODEL_SHAPES, TARGETS, Spec, prepare_inputs, prompts_of

SERVINGS = ("adapter", "merged")
RANK, ALPHA = 64, 32


def random_adapter(spec: Spec, seed: int) -> Any:
    """An r64 adapter on every linear layer of `spec`'s model, A and B random (bf16), in one
    host buffer as the PEFT trainer exports its adapter (`FlatTensors`): the engine hands it
    to SGLang as it is, so its update time is the one the training loop sees."""
    import torch

    from trainer.backends.base import LoraAdapter
    from trainer.backends.flat_tensors import FlatTensors

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(spec.model_shape["num_hidden_layers"]):
        for module, (fan_in, fan_out) in projection_shapes(spec).items():
            name = f"base_model.model.model.layers.{layer}.{module}"
            for key, shape in (("lora_A", (RANK, fan_in)), ("lora_B", (fan_out, RANK))):
                values = torch.randn(shape, generator=generator) * 0.01
                tensors[f"{name}.{key}.weight"] = values.to(torch.bfloat16)
    config = {
        "peft_type": "LORA", "r": RANK, "lora_alpha": ALPHA, "target_modules": TARGETS,
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "use_dora": False,
    }  # fmt: skip
    return LoraAdapter(tensors=FlatTensors.pack(tensors, device="cpu"), config=config, version=1)


def profiled_generate(
    engine: Any, prompts: list[list[int]], params: Any, directory: Path
) -> StepProfile:
    """One generate call of `engine` under its device profiler, summed up."""
    with engine.device_profile(directory) as traces:
        started = time.perf_counter()
        engine.generate(prompts, params)
        elapsed = time.perf_counter() - started
    return profile_traces(traces, wall_s=elapsed)


def measure(spec: Spec, serving: str, repeats: int, profile: bool, conn: Connection) -> None:
    """In a worker process: one engine serving `serving`, its update and generate times."""
    try:
        from transformers import AutoTokenizer

        from trainer.backends import registry
        from trainer.backends.base import SamplingParams

        memory = functools.partial(device_memory, "cuda:0")
        args = ours_config(spec, 1, memory, ("--lora-serving", serving))
        engine = registry.create_rollout(args, "cuda:0")
        adapter = random_adapter(spec, spec.seed)
        updates = []
        for _ in range(repeats + 1):
            started = time.perf_counter()
            engine.load_adapter(adapter)
            updates.append(time.perf_counter() - started)
        tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        texts = prompts_of(spec)[: spec.prompts]
        prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        prompts = [p for p in prompts for _ in range(spec.samples)]
        times: dict[str, list[float]] = {"seeded": [], "unseeded": []}
        tokens: dict[str, int] = {"seeded": 0, "unseeded": 0}
        for index in range(repeats + 1):
            for kind, seed in (("seeded", 1000 + index), ("unseeded", None)):
                params = SamplingParams(max_new_tokens=spec.response_len, seed=seed)
                started = time.perf_counter()
                generations = engine.generate(prompts, params)
                elapsed = time.perf_counter() - started
                if index:  # the first round warms up
                    times[kind].append(elapsed)
                    tokens[kind] += sum(len(g.response_ids) for g in generations)
        result = {
            "updates": updates[1:],
            "times": times,
            "tokens": tokens,
            "fraction": args.sglang.sglang_mem_fraction_static,
        }
        if profile:
            params = SamplingParams(max_new_tokens=spec.response_len, seed=999)
            directory = Path(tempfile.mkdtemp(prefix=f"profile-{serving}-", dir=spec.work))
            result["profile"] = profiled_generate(engine, prompts, params, directory)
        engine.shutdown()
        conn.send(("result", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def run(spec: Spec, serving: str, repeats: int, profile: bool) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=measure, args=(spec, serving, repeats, profile, child))
    process.start()
    child.close()
    try:
        tag, payload = parent.recv()
    except EOFError:
        tag, payload = "error", f"worker exited with code {process.exitcode}"
    process.join(timeout=120)
    if tag == "error":
        sys.exit(f"rollout_serving: {serving} failed:\n{payload}")
    return payload


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=tuple(MODEL_SHAPES), default="qwen3-0.6b")
    parser.add_argument("--serving", default=",".join(SERVINGS), help="comma list of servings")
    parser.add_argument("--repeats", type=int, default=3, help="timed generate calls per kind")
    parser.add_argument("--ours-flags", default="", help="more train.py flags, after '='")
    parser.add_argument(
        "--variant",
        action="append",
        metavar="NAME=FLAGS",
        help="measure each serving again with these train.py flags added (repeatable; "
        "--variant compile='--sglang-enable-torch-compile'); default: one, 'base', with none",
    )
    parser.add_argument(
        "--hbm-tbps",
        type=float,
        help="HBM bandwidth in TB/s for the decode bound (default: the device's, by its name)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="one more generate per engine under the profiler"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    options = parser.parse_args(argv)
    servings = [s.strip() for s in options.serving.split(",") if s.strip()]
    if not servings or any(s not in SERVINGS for s in servings) or options.repeats < 1:
        parser.error(f"--serving: a comma list of {', '.join(SERVINGS)}; --repeats >= 1")
    variants = parse_variants(parser, options.variant or ["base="])
    import torch

    if not torch.cuda.is_available():
        parser.error("it runs SGLang's engine on a CUDA GPU: none is visible here")
    bandwidth, source = bound_bandwidth(options.hbm_tbps, torch.cuda.get_device_name(0))
    if bandwidth is None:
        parser.error(f"the decode bound's HBM bandwidth is {source}")
    with tempfile.TemporaryDirectory(prefix="rollout-serving-") as work:
        spec = Spec(
            work=work, device="cuda", tiny=False, prompts=8, samples=8, prompt_len=256,
            response_len=512, micro_batch=16, lr=2e-5, seed=42, rollout_backend="sglang",
            shape=options.shape, ours_flags=shlex.split(options.ours_flags), ours_memory="keep",
        )  # fmt: skip
        prepare_inputs(spec, rows=spec.prompts)
        results = {
            (variant, serving): run(
                replace(spec, ours_flags=[*spec.ours_flags, *flags]),
                serving,
                options.repeats,
                options.profile,
            )
            for variant, flags in variants.items()
            for serving in servings
        }
    base, lora = count_params(spec)
    bound = decode_bound(spec, bandwidth, base, lora)
    flags = shlex.join(sglang_flags(spec))
    print(f"\n{options.shape}, 8 prompts x 8 samples, 256 + 512 tokens, decode bound {bound:.0f} "
          f"tok/s at {source}; {flags} {options.ours_flags}")  # fmt: skip
    for variant, flags in variants.items():
        print(f"variant {variant}: {shlex.join(flags) or '(no flags)'}")
    width = max(7, *map(len, variants))
    print(
        f"{'variant':<{width}} {'serving':<8} {'seeds':<9} {'median s':>9} {'tok/s':>8} "
        f"{'of bound':>9} {'update s':>9} {'fraction':>9}"
    )
    for (variant, serving), r in results.items():
        update = statistics.median(r["updates"])
        for kind, times in r["times"].items():
            rate = r["tokens"][kind] / sum(times)
            print(
                f"{variant:<{width}} {serving:<8} {kind:<9} {statistics.median(times):>9.3f} "
                f"{rate:>8.0f} {rate / bound:>9.1%} {update:>9.3f} {r['fraction']:>9g}"
            )
    for (variant, serving), r in results.items():
        if "profile" in r:
            print("\n".join(r["profile"].lines(f"profile {variant} {serving} (seeded)")))
    if options.json:
        named = {
            f"{variant}/{serving}": {k: asdict(v) if k == "profile" else v for k, v in r.items()}
            for (variant, serving), r in results.items()
        }
        options.json.write_text(json.dumps({"bound": bound, "results": named}, indent=1))


def parse_variants(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, list[str]]:
    """``NAME=FLAGS`` entries -> {name: flags}, in the order given."""
    variants: dict[str, list[str]] = {}
    for entry in given:
        name, eq, flags = entry.partition("=")
        if not eq or not name.strip() or name.strip() in variants:
            parser.error(f"--variant {entry!r}: expected a new NAME=FLAGS")
        variants[name.strip()] = shlex.split(flags)
    return variants


if __name__ == "__main__":
    main()
