"""GRPO LoRA step time: this project against TRL's GRPOTrainer + PEFT, Unsloth and verl, same work.

The workload (issue 10): a Qwen3-architecture model with random weights and a word-level
tokenizer, both built locally: `--shape qwen3-0.6b` (the default; hidden 1024, 28 layers, 16
heads, 8 KV heads, head_dim 128, intermediate 3072, vocabulary 151,936, tied embeddings) or
`--shape qwen3-4b` (the seed recipe's model, `trainer.tiny`'s shape); 8 prompts x 8 samples per
step, 256-token prompts, 512 response tokens with EOS ignored (every sample that long), LoRA
r=64 alpha=32 dropout 0 on all linear layers, bf16, lr 2e-5, no KL (beta 0), one generation and
one optimizer update per step; every system's reward is `trainer.tiny.parity` (of the response
text's length).

* *ours*: the project's fastest single-GPU pairing, SGLang rollout + PEFT trainer colocated,
  driven in this process tree through the project's own backends and `GRPOLoop.step` (the
  trainer's argv goes through train.py's parser; `--ours-flags` adds to it).
* *trl*: TRL 1.16's GRPOTrainer + PEFT with the settings of the measured baseline
  (`use_vllm=False`, its default transformers generation with `min_new_tokens` = response
  length, 16 x 4 micro-batches, `beta=0`).
* *trl-vllm* (CUDA only): the same GRPOTrainer and settings with `use_vllm=True,
  vllm_mode="colocate"`: vLLM runs in the worker's own process at TRL's default
  `vllm_gpu_memory_utilization` (0.3; TRL sets the RANK, WORLD_SIZE and MASTER_* variables
  vLLM's `external_launcher` reads, so no launcher is needed), and before each step's generation
  TRL merges the LoRA adapter into the base weights, loads them into vLLM and unmerges. EOS is
  ignored through `generation_kwargs` (handed to vLLM's `SamplingParams`): `min_tokens` =
  response length with the tokenizer's EOS as a stop token, so vLLM masks it as transformers'
  `min_new_tokens` does.
  `vllm_enable_sleep_mode` is on when the systems run side by side (below), for two reasons:
  memory, since the three workers hold their memory side by side on one GPU (on an H200 of 140
  GiB: ours about 28 GiB, trl 57 GiB, and trl-vllm without sleep its 42 GiB vLLM pool plus about
  27 GiB of training, 154 GiB in all; asleep at level 2, vLLM frees its weights and KV cache
  while TRL trains, and TRL empties torch's cache before waking it; between their steps all
  workers empty theirs, since with ours' `--ours-memory keep` (49 GiB) vLLM's wake-up ran out of
  memory); and likeness, since ours' colocated engine releases its memory during training as
  well. With `--one-at-a-time` memory does not need it, and it is off; `--vllm-sleep` /
  `--no-vllm-sleep` decide otherwise. TRL's other vLLM defaults stay: its importance-sampling
  correction costs one no-grad forward over the rollout per step. Its phases: `sync_weights`
  (waking vLLM's discarded weights, merge, load, unmerge); the rest of generation is its rollout
  (waking the KV cache, generating, and putting vLLM back to sleep).
* *unsloth* (CUDA only): Unsloth 2026.10.9's GRPO as its users run it: `FastLanguageModel.
  from_pretrained(..., load_in_4bit=False, fast_inference=True, max_lora_rank=64)` (vLLM in the
  worker's process at Unsloth's `gpu_memory_utilization` 0.5), `FastLanguageModel.get_peft_model`
  (r 64, alpha 32, the seven projections), then TRL's GRPOTrainer as importing Unsloth patches it
  (TRL 1.15: Unsloth allows <= 1.15.0), with trl-vllm's config less sleep mode: vLLM shares
  the training model's base weights, into which Unsloth folds the adapter in place before each
  generation and unfolds it after (its "merged-weight rollouts", as its log showed on an H100);
  its `load_lora` phase times `model.load_lora`; the fold and unfold count in that phase or in
  the generation, wherever Unsloth runs them. Gradient checkpointing is Unsloth's own
  ("unsloth", offloaded) where `--gradient-checkpointing` asks for it, else off.
* *verl* (CUDA only, `--one-at-a-time` only): verl 0.9.1's GRPO with LoRA from its default
  `ppo_trainer` config on one GPU: FSDP actor, vLLM 0.24 in server mode serving the adapter
  (`benchmarks/verl_system.py` says what it changes and how its steps are read: verl runs its
  own loop in Ray, unpaced).

`--gradient-checkpointing` turns each system's own activation recomputation on (ours
`--gradient-checkpointing`, TRL's `gradient_checkpointing`, Unsloth's "unsloth", verl's
`enable_gradient_checkpointing`): long responses (`--response-len 4096` or the seed's 8192 at
`--shape qwen3-4b`) need it or smaller micro-batches. `--vllm-memory` sets the GPU share of the
vLLM systems' engines (trl-vllm, unsloth, verl; otherwise each one's default: TRL 0.3, Unsloth
and verl 0.5). `--kv-cache-dtype fp8` keeps every engine's KV cache in 8-bit floating point
(e4m3: ours' `--sglang-kv-cache-dtype fp8_e4m3`, Unsloth's `float8_kv_cache`, verl's vLLM
`kv_cache_dtype fp8`): half the bytes per token of context to hold and to read in each decode
step, the same format for every system that takes it (trl and trl-vllm do not; refused).

Each system lives in its own worker process; after `--warmup` steps each, the parent makes them
take their timed steps in turn (ours, trl, trl-vllm, ours, ...; `--trl-steps` etc. give one
system fewer, e.g. the slow `trl`, which then drops out of the later rounds). `--one-at-a-time`
runs them one after another instead, each alone on the device (started, warmed up, timed,
ended), for shapes whose systems do not fit the device together (Qwen3-4B on an H200); a system
that fails there, out of memory say, is reported with its error and the others still run.
With `--json`, each system's results are written as it ends; a run stopped part way (by a
node's time limit, say) continues with the same arguments and `--resume`, which runs only the
systems still pending and reports them all (refused for another workload or another device).
`--inputs DIR` keeps the random model there, so later runs of the same shape and seed on the
node reuse it instead of building it again (a minute for the Qwen3-4B shape); with
`--inputs-only` the benchmark builds them and exits, without the systems' packages.
`--step-timeout S` fails a system that does not answer (start, step) within S seconds and ends
its processes.
`--report JSON` prints the report of an earlier run's `--json` on any machine (one whose own
report a node's limit cut) and runs nothing.
`--SYSTEM-path` puts directories first on that worker's `sys.path` and `PYTHONPATH` only, and
takes every other system's `--SYSTEM-path` off both (also where the parent's `PYTHONPATH` holds
it): on a node where vLLM's and SGLang's pins conflict, each comes from its own wheelhouse target.
Reported per system: the package versions its worker imported, step time median / min / max,
rollout tokens/s (generated tokens over the generation time, prefill included), training
tokens/s (prompt + response tokens over the rest of the step), peak GPU memory (NVML, the
worker's whole process tree, SGLang's scheduler included; and torch's peak allocated and peak
reserved in the worker itself: NVML's count above the reserved peak is the CUDA context and
other libraries' memory, the reserved peak above the allocated one about the caching allocator's
free blocks), the NVML peak within each phase the system times (ours' loop phases; a TRL-driven
system's rollout and adapter hand-over, the rest of its step as "rest": which phase sets the
peak), the ratio of each other system's median to ours, and the decode roofline: the
rollout's throughput against the bound HBM bandwidth sets (weights + LoRA + KV cache read once
per decode step).

    python benchmarks/grpo_vs_trl.py                       # ours and trl on the H200 (CUDA)
    python benchmarks/grpo_vs_trl.py --systems ours,trl,trl-vllm --trl-vllm-path /tmp/site-vllm
    python benchmarks/grpo_vs_trl.py --device cpu --tiny   # tiny model, HF rollout, on CPU
    python benchmarks/grpo_vs_trl.py --shape qwen3-4b --systems ours,trl-vllm,trl --one-at-a-time
    python benchmarks/grpo_vs_trl.py --shape qwen3-4b --response-len 8192 --one-at-a-time \
      --systems ours,unsloth,verl --gradient-checkpointing --micro-batch 2 \
      --unsloth-path /tmp/site-unsloth:/tmp/site-vllm --verl-path /tmp/site-verl:/tmp/site-ray

Needs ``pip install -e '.[bench]'`` (trl, datasets) and, for the GPU systems, SGLang, vLLM,
Unsloth and verl (docs/offline-nodes.md: their wheelhouses).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, fields
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.comparison_report import ratios, report, summary
from benchmarks.ours_system import OURS_MEMORY
from benchmarks.peak_memory import device_used
from benchmarks.system_worker import SystemPath, Worker, WorkerFailed, out_of_memory
from benchmarks.trl_system import UNSLOTH_VLLM_MEMORY
from benchmarks.workload import (
    KV_CACHE_DTYPES,
    MODEL_SHAPES,
    RUN_LOCAL,
    Spec,
    StepTime,
    prepare_inputs,
)

SYSTEMS = ("ours", "trl", "trl-vllm", "unsloth", "verl")
VLLM_SYSTEMS = ("trl-vllm", "unsloth", "verl")
KV_CACHE_FIXED = ("trl", "trl-vllm")  # no setting for the KV cache's format (--kv-cache-dtype)
SPEC_DEFAULTS = {f.name: f.default for f in fields(Spec) if f.default is not MISSING}


# ---------------------------------------------------------------------------- machine


def device_name(spec: Spec) -> str:
    import torch

    return torch.cuda.get_device_name(0) if spec.device.startswith("cuda") else "CPU"


def machine(spec: Spec) -> str:
    return f"{device_name(spec)}, {os.cpu_count()} cores"


# ---------------------------------------------------------------------------- main


INSTALL = {
    "trl": "pip install -e '.[bench]'",
    "datasets": "pip install -e '.[bench]'",
    "psutil": "pip install -e '.[bench]'",
    "sglang": "SGLang's wheels (docs/offline-nodes.md on a node without internet)",
    "vllm": "vLLM's wheels, e.g. in their own target for --trl-vllm-path (docs/offline-nodes.md)",
    "pynvml": "pip install nvidia-ml-py",
    "peft": "pip install -e '.[portable]'",
    "transformers": "pip install -e '.[portable]'",
    "unsloth": "Unsloth's wheels in their own target for --unsloth-path, with vLLM's "
    "(constraints/unsloth-2026.10.9-trl-1.15.txt, docs/offline-nodes.md)",
    "unsloth_zoo": "Unsloth's wheels (constraints/unsloth-2026.10.9-trl-1.15.txt)",
    "verl": "verl's wheels in their own target for --verl-path, with Ray's "
    "(constraints/verl-0.9.1-vllm-0.24.0.txt, docs/offline-nodes.md)",
    "hydra": "verl's wheels (constraints/verl-0.9.1-vllm-0.24.0.txt)",
    "pandas": "verl's wheels (constraints/verl-0.9.1-vllm-0.24.0.txt)",
    "ray": "Ray's wheels, e.g. on --verl-path (docs/offline-nodes.md)",
}


def needed_modules(spec: Spec, kind: str) -> list[str]:
    needed = ["psutil", "peft", "transformers"]
    if kind in ("trl", "trl-vllm", "unsloth"):
        needed += ["trl", "datasets"]
    if kind in VLLM_SYSTEMS:
        needed.append("vllm")
    if kind == "unsloth":
        needed += ["unsloth", "unsloth_zoo"]
    if kind == "verl":
        needed += ["verl", "ray", "hydra", "pandas"]
    if kind == "ours" and spec.rollout_backend == "sglang":
        needed.append("sglang")
    if spec.device.startswith("cuda"):
        needed.append("pynvml")
    return needed


def missing_packages(spec: Spec, paths: dict[str, SystemPath]) -> list[str]:
    """'module for system (how to install it)' for every module a system's worker needs and
    cannot import from its path (`SystemPath.search`)."""
    missing = []
    for kind, path in paths.items():
        for module in needed_modules(spec, kind):
            if PathFinder.find_spec(module, path.search()) is None:
                missing.append(f"{module} for {kind} ({INSTALL[module]})")
    return missing


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Spec]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the tiny model of trainer/tiny.py")
    parser.add_argument(
        "--shape", choices=tuple(MODEL_SHAPES), default="qwen3-0.6b", help="model (random weights)"
    )
    parser.add_argument(
        "--systems", default="ours,trl", help=f"comma list of {', '.join(SYSTEMS)} (CUDA only)"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per system (>= 1)")
    for kind in SYSTEMS:
        parser.add_argument(f"--{kind}-steps", type=int, help=f"timed steps of {kind} (--steps)")
        parser.add_argument(
            f"--{kind}-path",
            default="",
            help=f"directories ({os.pathsep}-separated) first on {kind}'s sys.path and "
            "PYTHONPATH, and off every other system's",
        )
    parser.add_argument("--warmup", type=int, help="untimed steps per system first (2; tiny: 1)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, help="prompt tokens (256; tiny: 16)")
    parser.add_argument("--response-len", type=int, help="response tokens (512; tiny: 32)")
    parser.add_argument("--micro-batch", type=int, default=16, help="samples per micro-batch")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--rollout-backend", choices=("sglang", "hf"), help="ours' engine (cuda: sglang, cpu: hf)"
    )
    parser.add_argument(
        "--ours-flags",
        default="",
        help="more train.py flags for ours, after '=' (--ours-flags='--sglang-log-level info')",
    )
    parser.add_argument(
        "--ours-memory",
        choices=tuple(OURS_MEMORY),
        default="release",
        help="ours' colocated GPU memory: swapped around training (release, as the recipes), "
        "the engine's KV cache and CUDA graphs only, the engine merging from the trainer's base "
        "(release-kv), engine and trainer both "
        "resident (keep), or train.py's estimate decides (auto)",
    )
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="each system alone on the device in turn (started, warmed up, timed, ended), for "
        "shapes whose systems do not fit the device together; a system that fails is reported "
        "as failed and the others still run (default: side by side, timed steps in turn)",
    )
    parser.add_argument(
        "--vllm-sleep",
        action=argparse.BooleanOptionalAction,
        help="trl-vllm: vLLM's sleep mode during training (default: on side by side, where "
        "the three systems' memory needs it; off with --one-at-a-time)",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="every system recomputes activations in backward, each its own way (long responses)",
    )
    parser.add_argument(
        "--vllm-memory",
        type=float,
        help="GPU share of the vLLM engines of trl-vllm, unsloth and verl (default: each one's "
        f"own: TRL 0.3, Unsloth {UNSLOTH_VLLM_MEMORY}, verl 0.5)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=tuple(KV_CACHE_DTYPES),
        default="auto",
        help="every engine's KV cache: the model's dtype (auto), or 8-bit floating point (fp8, "
        "e4m3: ours' SGLang fp8_e4m3, Unsloth's float8_kv_cache, verl's vLLM fp8; trl and "
        "trl-vllm have no such setting)",
    )
    parser.add_argument(
        "--hbm-tbps",
        type=float,
        help="HBM bandwidth in TB/s for the decode bound (default: the device's, by its name: "
        "H100 3.35, H200 4.8, ...; decode_bound.HBM_TBPS)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="print the report of an earlier run's --json (its device and workload) and exit",
    )
    parser.add_argument(
        "--inputs",
        type=Path,
        help="keep the random model and the prompts in this folder and reuse the model in "
        "later runs of the same shape and seed (the Qwen3-4B shape takes a minute to build)",
    )
    parser.add_argument(
        "--inputs-only",
        action="store_true",
        help="build (or keep) --inputs' model and prompts for this workload, then exit without "
        "the systems' packages: a node makes them while its packages still arrive, and a "
        "kernel benchmark (SGLang's bench_one_batch) loads the model from DIR/model",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        metavar="S",
        help="the longest wait, in seconds, for a system's start or any one of its steps; a "
        "system that takes longer is failed and its processes ended (with --one-at-a-time the "
        "others still run). Default: no limit",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --one-at-a-time: run only the systems --json's earlier run left pending "
        "(stopped by a node's time limit, say; same workload, same device) and report them all",
    )
    options = parser.parse_args(argv)
    if options.report is not None:  # prints, runs nothing, as --help does
        try:
            saved_report(options.report, options.hbm_tbps)
        except ValueError as err:
            parser.exit(2, f"{parser.prog}: error: --report: {err}\n")
        parser.exit(0)
    systems = [s.strip() for s in options.systems.split(",") if s.strip()]
    if not systems or any(s not in SYSTEMS for s in systems):
        parser.error(f"--systems {options.systems!r}: a comma list of {', '.join(SYSTEMS)}")
    for kind in (k for k in systems if k in VLLM_SYSTEMS and options.device != "cuda"):
        parser.error(f"--systems {kind}: vLLM needs --device cuda")
    if "verl" in systems and not options.one_at_a_time:
        parser.error("--systems verl: verl runs its own loop unpaced, so it needs --one-at-a-time")
    if options.kv_cache_dtype != "auto":
        unable = [kind for kind in systems if kind in KV_CACHE_FIXED]
        if unable:
            parser.error(
                f"--kv-cache-dtype {options.kv_cache_dtype}: {', '.join(unable)} keep the KV "
                "cache in the model's dtype (TRL 1.15 passes no KV-cache format to vLLM; "
                "transformers' generate has none): leave them out of --systems"
            )
        if "ours" in systems and (options.rollout_backend == "hf" or options.device == "cpu"):
            parser.error(
                f"--kv-cache-dtype {options.kv_cache_dtype}: ours' transformers engine (the "
                "CPU's, or --rollout-backend hf) keeps the KV cache in the model's dtype: run "
                "ours with SGLang on --device cuda"
            )
    if options.vllm_memory is not None and not 0 < options.vllm_memory <= 1:
        parser.error(f"--vllm-memory {options.vllm_memory}: a share of the GPU, in (0, 1]")
    options.systems = systems
    if options.warmup is None:
        options.warmup = 1 if options.tiny else 2
    options.steps = {kind: own_steps(options, kind) for kind in systems}
    if options.step_timeout is not None and options.step_timeout <= 0:
        parser.error(f"--step-timeout {options.step_timeout:g}: seconds, more than 0")
    if min(options.steps.values()) < 1 or options.warmup < 0:
        parser.error("--steps must be >= 1 (every --SYSTEM-steps too) and --warmup >= 0")
    given = {kind: own_path(options, kind) for kind in SYSTEMS}
    for kind, folders in given.items():
        for folder in folders:
            if not Path(folder).is_dir():
                parser.error(f"--{kind}-path: {folder} is not a directory")
    options.paths = {}
    for kind in systems:
        others = (f for other in SYSTEMS if other != kind for f in given[other])
        hidden = [f for f in dict.fromkeys(others) if f not in given[kind]]
        options.paths[kind] = SystemPath(given[kind], hidden)
    rows = options.prompts * options.samples
    if options.micro_batch < 1 or rows % options.micro_batch:
        parser.error(f"--micro-batch {options.micro_batch} does not divide {rows} samples")
    spec = Spec(
        work="",
        device=options.device,
        tiny=options.tiny,
        prompts=options.prompts,
        samples=options.samples,
        prompt_len=options.prompt_len or (16 if options.tiny else 256),
        response_len=options.response_len or (32 if options.tiny else 512),
        micro_batch=options.micro_batch,
        lr=options.lr,
        seed=options.seed,
        rollout_backend=options.rollout_backend or ("hf" if options.device == "cpu" else "sglang"),
        shape=options.shape,
        ours_flags=shlex.split(options.ours_flags),
        ours_memory=options.ours_memory,
        vllm_sleep=(
            not options.one_at_a_time if options.vllm_sleep is None else options.vllm_sleep
        ),
        gradient_checkpointing=options.gradient_checkpointing,
        vllm_memory=options.vllm_memory,
        kv_cache_dtype=options.kv_cache_dtype,
        inputs=str(options.inputs.resolve()) if options.inputs else "",
    )
    if spec.prompt_len + spec.response_len > spec.max_positions:
        model = "the tiny model" if spec.tiny else f"the {spec.shape} shape"
        parser.error(
            f"--prompt-len {spec.prompt_len} + --response-len {spec.response_len} tokens: over "
            f"the {spec.max_positions} positions of {model}"
        )
    if options.inputs_only:
        if options.inputs is None:
            parser.error("--inputs-only: give --inputs DIR, the folder to build them in")
        return options, spec
    missing = missing_packages(spec, options.paths)
    if missing:
        parser.exit(
            2,
            f"{parser.prog}: error: missing Python packages: {'; '.join(missing)}\n",
        )
    if "verl" in options.paths:
        from benchmarks.verl_system import peft_problem

        problem = peft_problem(options.paths["verl"].search())
        if problem:
            parser.error(f"--systems verl: {problem}")
    if options.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, f"{parser.prog}: error: --device cuda: no CUDA device here\n")
    options.earlier = {}
    if options.resume:
        try:
            options.earlier = earlier_results(options, spec)
        except ValueError as err:
            parser.exit(2, f"{parser.prog}: error: --resume: {err}\n")
    return options, spec


def earlier_results(options: argparse.Namespace, spec: Spec) -> dict[str, dict[str, Any]]:
    """The results of the `--json` document a stopped `--one-at-a-time` run left, if it ran
    this workload on this kind of device (ratios only compare runs on one device); a system
    that failed there stays failed (out of memory is a result), one never run is run now."""
    if options.json is None or not options.one_at_a_time:
        raise ValueError("continues an earlier --one-at-a-time run: give both and its --json")
    document = read_document(options.json)
    if not document["one_at_a_time"]:
        raise ValueError(f"{options.json} is not the JSON of a --one-at-a-time run")
    if document.get("machine") != machine(spec):
        raise ValueError(
            f"{options.json} ran on {document.get('machine', 'an unnamed machine')}, "
            f"not on this {machine(spec)}"
        )
    now = {key: value for key, value in asdict(spec).items() if key not in RUN_LOCAL}
    then = {**SPEC_DEFAULTS, **document.get("spec", {})}  # a field added since: its default
    changed = sorted(key for key in now if then.get(key) != now[key])
    if changed:
        raise ValueError(
            f"{options.json} ran another workload ({', '.join(changed)} differ): give its "
            "arguments again"
        )
    return dict(document["results"])


def own_steps(options: argparse.Namespace, kind: str) -> int:
    steps = getattr(options, f"{kind.replace('-', '_')}_steps")
    return options.steps if steps is None else steps


def own_path(options: argparse.Namespace, kind: str) -> list[str]:
    return [d for d in getattr(options, f"{kind.replace('-', '_')}_path").split(os.pathsep) if d]


def main(argv: list[str] | None = None) -> None:
    options, spec = parse(argv)
    rows = spec.prompts * (options.warmup + max(options.steps.values()) + 2)
    if options.inputs_only:
        print(prepare_inputs(spec, rows=rows))
        return
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as work:
        spec.work = work
        print(prepare_inputs(spec, rows=rows), flush=True)
        baseline = device_used(spec.device)
        workers: dict[str, Worker] = {}
        run = run_one_at_a_time if options.one_at_a_time else run_side_by_side
        save = functools.partial(write_json, options, spec) if options.json else None
        try:
            results = run(options, spec, baseline, workers, save=save)
        except WorkerFailed as failure:
            sys.exit(f"grpo_vs_trl: {failure}")
        finally:
            for w in workers.values():  # after a failure, the others wait for commands
                w.stop()
    report(
        spec,
        results,
        options.hbm_tbps,
        machine=machine(spec),
        alone=options.one_at_a_time,
        earlier=list(options.earlier),
    )


def read_document(path: Path) -> dict[str, Any]:
    """A `--json` document (`write_json`'s), or a one-line ValueError saying why it is not."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path} is not a --json document of this benchmark")
    for key in ("spec", "machine", "one_at_a_time", "results"):
        if key not in document:
            raise ValueError(f"{path} has no {key!r}: not a --json of this version")
    return document


def saved_report(path: Path, hbm_tbps: float | None) -> None:
    """Print the report of a run's `--json` document (one whose own report a node's time limit
    cut, say), on any machine: the device and the workload are the document's."""
    document = read_document(path)
    try:
        spec = Spec(**document["spec"])
    except TypeError as err:
        raise ValueError(f"{path}: its spec is not this version's ({err})") from None
    report(
        spec,
        document["results"],
        hbm_tbps,
        machine=document["machine"],
        alone=document["one_at_a_time"],
    )
    pending = document.get("pending") or []
    if pending:
        print(f"not run: {', '.join(pending)} (the same command with --resume runs them)")


def write_json(options: argparse.Namespace, spec: Spec, results: dict[str, dict[str, Any]]) -> None:
    """The results so far as ``--json``; `pending` names the systems still to run (a run
    stopped part way, by a node's time limit say, keeps the systems it finished)."""
    document = {
        "spec": asdict(spec),
        "machine": machine(spec),
        "one_at_a_time": options.one_at_a_time,
        "results": results,
        "ratios": ratios(results),
        "pending": [kind for kind in options.systems if kind not in results],
    }
    options.json.write_text(json.dumps(document, indent=1))


def start_worker(kind: str, options: argparse.Namespace, spec: Spec, baseline: int) -> Worker:
    started = time.perf_counter()
    total = options.warmup + options.steps[kind]
    w = Worker(kind, spec, total, baseline, options.paths[kind], options.step_timeout)
    print(f"{kind}: ready in {time.perf_counter() - started:.1f} s", flush=True)
    return w


def warm_up(w: Worker, steps: int) -> None:
    for index in range(steps):
        t = w.step()
        print(f"{w.kind} warm-up {index + 1}: {t.step_s:.2f} s", flush=True)


def timed_step(w: Worker, index: int) -> StepTime:
    t = w.step(reset=index == 0)
    print(f"{w.kind} step {index + 1}: {t.step_s:.2f} s (rollout {t.rollout_s:.2f} s)", flush=True)
    return t


def result_of(w: Worker, times: list[StepTime]) -> dict[str, Any]:
    return {
        "times": [asdict(t) for t in times],
        "summary": summary(times),
        **w.finish(),
        "versions": w.versions,
    }


def run_side_by_side(
    options: argparse.Namespace,
    spec: Spec,
    baseline: int,
    workers: dict[str, Worker],
    *,
    save: Callable[[dict[str, dict[str, Any]]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Start the workers (into `workers`), warm each up, then alternate the timed steps: round
    `i` steps every system that has more than `i` timed steps. A failing system ends the run.
    `save` gets the results once every system has taken its steps."""
    # One at a time: SGLang sizes its pool from free memory, and vLLM's start-up profile fails
    # when another process frees memory meanwhile.
    for kind in options.systems:
        workers[kind] = start_worker(kind, options, spec, baseline)
    for w in workers.values():
        warm_up(w, options.warmup)
    times: dict[str, list[StepTime]] = {kind: [] for kind in workers}
    for index in range(max(options.steps.values())):
        for kind, w in workers.items():
            if index < options.steps[kind]:
                times[kind].append(timed_step(w, index))
    results = {kind: result_of(w, times[kind]) for kind, w in workers.items()}
    if save is not None:
        save(results)
    return results


def run_one_at_a_time(
    options: argparse.Namespace,
    spec: Spec,
    baseline: int,
    workers: dict[str, Worker],
    *,
    save: Callable[[dict[str, dict[str, Any]]], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each system alone on the device in turn: started, warmed up, timed, its worker ended
    before the next starts. A system that fails (out of memory at a large shape) is reported
    with its error (its worker has printed the traceback), and the others still run. `save`
    gets the results after each system, its worker ended. Systems with results from an earlier
    run (`--resume`) are not run again."""
    results: dict[str, dict[str, Any]] = dict(options.earlier)
    for kind in (k for k in options.systems if k not in results):
        stage = "start"
        try:
            w = workers[kind] = start_worker(kind, options, spec, baseline)
            stage = "warm-up"
            warm_up(w, options.warmup)
            times = []
            for index in range(options.steps[kind]):
                stage = f"step {index + 1}"
                times.append(timed_step(w, index))
            results[kind] = result_of(w, times)
        except WorkerFailed as failure:
            print(f"{kind}: failed at {stage}: {failure.reason}", flush=True)
            results[kind] = {
                "failed": failure.reason,
                "stage": stage,
                "out_of_memory": out_of_memory(failure.details),
            }
        finally:
            if kind in workers:
                workers.pop(kind).stop()  # its memory free before the next system starts
        if save is not None:
            save(results)
    return results


if __name__ == "__main__":
    main()
