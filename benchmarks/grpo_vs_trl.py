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
and verl 0.5).

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
node reuse it instead of building it again (a minute for the Qwen3-4B shape). `--step-timeout S`
fails a system that does not answer (start, step) within S seconds and ends its processes.
`--report JSON` prints the report of an earlier run's `--json` on any machine (one whose own
report a node's limit cut) and runs nothing.
`--SYSTEM-path` puts directories first on that worker's `sys.path` and `PYTHONPATH` only: on a
node where vLLM's and SGLang's pins conflict, each comes from its own wheelhouse target.
Reported per system: the package versions its worker imported, step time median / min / max,
rollout tokens/s (generated tokens over the generation time, prefill included), training
tokens/s (prompt + response tokens over the rest of the step), peak GPU memory (NVML, the
worker's whole process tree, SGLang's scheduler included; and torch's peak allocated and peak
reserved in the worker itself: NVML's count above the reserved peak is the CUDA context and
other libraries' memory, the reserved peak above the allocated one about the caching allocator's
free blocks), the ratio of each other system's median to ours, and the decode roofline: the
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
import contextlib
import functools
import json
import math
import multiprocessing
import os
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.machinery import PathFinder
from importlib.util import find_spec
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.comparison_report import ratios, report, summary
from trainer.config import TrainConfig
from trainer.job.memory_estimate import DeviceMemory
from trainer.tiny import SHAPES, parity

SYSTEMS = ("ours", "trl", "trl-vllm", "unsloth", "verl")
VLLM_SYSTEMS = ("trl-vllm", "unsloth", "verl")
# what each system's vLLM engine takes of the GPU where `--vllm-memory` is not given
UNSLOTH_VLLM_MEMORY = 0.5  # FastLanguageModel.from_pretrained's default
# the phase within a TRL-driven rollout that hands the adapter to vLLM
ADAPTER_PHASE = {"trl-vllm": "sync_weights", "unsloth": "load_lora"}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# `--shape`: Qwen3-0.6B as released (`trainer.tiny`'s body with its 28 layers and 151,936
# embeddings), and Qwen3-4B as released (the seed recipe's model).
MODEL_SHAPES = {
    "qwen3-0.6b": {**SHAPES["qwen3-0.6b"], "num_hidden_layers": 28, "vocab_size": 151936},
    "qwen3-4b": SHAPES["qwen3-4b"],
}
SGLANG_FLAGS = (
    "--sglang-attention-backend triton --sglang-lora-backend triton "
    "--sglang-sampling-backend pytorch --sglang-cuda-graph-max-bs-decode 64 "
    "--sglang-disable-prefill-cuda-graph --sglang-log-level warning"
)
# ours' --sglang-mem-fraction-static where that holds the KV cache of a step (`engine_fraction`)
FRACTION_FLAG = "--sglang-mem-fraction-static"
SGLANG_FRACTION = 0.15
SGLANG_FRACTION_MAX = 0.85  # beyond it SGLang runs the samples in turns: the rest is the trainer's
# ours' colocated memory (`--ours-memory`): swapped around training with the base backed up on
# the host, as the recipes run it; only the engine's KV cache and CUDA graphs given back during
# training (its weights stay, nothing is copied); both sides resident all along; or train.py's
# estimate picks
OURS_MEMORY = {
    "release": ["--lora-base-cpu-backup"],
    "release-kv": ["--colocate-memory", "release"],
    "keep": ["--colocate-memory", "keep"],
    "auto": ["--colocate-memory", "auto", "--lora-base-cpu-backup"],
}


@dataclass
class Spec:
    """What every worker builds and runs (picklable: it travels to the worker processes)."""

    work: str
    device: str
    tiny: bool
    prompts: int
    samples: int
    prompt_len: int
    response_len: int
    micro_batch: int
    lr: float
    seed: int
    rollout_backend: str
    shape: str = "qwen3-0.6b"  # a MODEL_SHAPES key (unused with `tiny`)
    ours_flags: list[str] = field(default_factory=list)
    ours_memory: str = "release"  # an OURS_MEMORY key
    vllm_sleep: bool = True  # trl-vllm: vLLM's sleep mode (see the module's docstring)
    gradient_checkpointing: bool = False  # every system's own (see the module's docstring)
    vllm_memory: float | None = None  # the vLLM systems' GPU share; None: each one's default
    inputs: str = ""  # `--inputs`: the model and prompts kept here for later runs; "": in `work`

    @property
    def model_shape(self) -> dict[str, Any]:
        return MODEL_SHAPES[self.shape]

    @property
    def max_positions(self) -> int:
        """The model's context: prompt and response must fit it."""
        return (SHAPES["tiny"] if self.tiny else self.model_shape)["max_position_embeddings"]

    @property
    def model_dir(self) -> str:
        return str(Path(self.inputs or self.work) / "model")

    @property
    def prompt_file(self) -> str:
        return str(Path(self.inputs or self.work) / "prompts.jsonl")

    @property
    def model_key(self) -> dict[str, Any]:
        """What the random model and its tokenizer are built from."""
        return {"tiny": self.tiny, "shape": self.shape, "seed": self.seed}


# Spec fields that say where a run keeps its files, not what it measures
RUN_LOCAL = ("work", "inputs")


@dataclass
class StepTime:
    step_s: float
    rollout_s: float
    response_tokens: int
    total_tokens: int
    phases: dict[str, float] = field(default_factory=dict)  # ours: the loop's `time/*` metrics


# ---------------------------------------------------------------------------- model, data


def build_tokenizer(spec: Spec, *, eos: bool) -> Any:
    """The tiny task's tokenizer, or a word-level one over ``t<i>`` words for the full vocabulary
    (the tokenizer of the measured TRL baseline). Without `eos` it has no end-of-sequence token,
    so no engine stops early: every response is as long as asked."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trainer import tiny as tiny_task

    specials = list(tiny_task.SPECIAL_TOKENS)
    vocab = tiny_task.vocabulary(None if spec.tiny else spec.model_shape["vocab_size"])
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>" if eos else None,
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )


def prompt_words(spec: Spec) -> list[str]:
    from trainer import tiny as tiny_task

    if spec.tiny:
        return [*tiny_task.VERBS, *tiny_task.COLOURS]
    return list(tiny_task.vocabulary(spec.model_shape["vocab_size"]))[len(tiny_task.vocabulary()) :]


def prepare_inputs(spec: Spec, rows: int) -> str:
    """The model (`build_model`) unless `spec.inputs` holds it from an earlier run of the same
    `model_key`, and `rows` prompts (`write_prompts`); says which."""
    started = time.perf_counter()
    key_file = Path(spec.model_dir) / "benchmark-model.json"
    reused = key_file.is_file() and json.loads(key_file.read_text()) == spec.model_key
    if not reused:
        shutil.rmtree(spec.model_dir, ignore_errors=True)
        build_model(spec)
        key_file.write_text(json.dumps(spec.model_key))  # last: a half-built model is rebuilt
    write_prompts(spec, rows)
    took = f"in {time.perf_counter() - started:.1f} s"
    if reused:
        return f"model reused from {spec.model_dir}, prompts written {took}"
    return f"built model and prompts {took}"


def build_model(spec: Spec) -> None:
    """The random-weight model (no EOS in its configs) and tokenizer in `spec.model_dir`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from trainer import tiny as tiny_task

    tokenizer = build_tokenizer(spec, eos=False)
    tokenizer.save_pretrained(spec.model_dir)
    pad = tokenizer.pad_token_id
    if spec.tiny:
        model = tiny_task.build_model(len(tokenizer), pad, pad, spec.seed)
        model.config.eos_token_id = None
    else:
        config = Qwen3Config(
            **spec.model_shape,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=pad,
        )
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(pad_token_id=pad)
    model.save_pretrained(spec.model_dir)


def write_prompts(spec: Spec, rows: int) -> None:
    """`rows` prompts of `spec.prompt_len` words in `spec.prompt_file`."""
    rng = random.Random(spec.seed)
    words = prompt_words(spec)
    with open(spec.prompt_file, "w", encoding="utf-8") as f:
        for _ in range(rows):
            text = " ".join(rng.choice(words) for _ in range(spec.prompt_len))
            f.write(json.dumps({"prompt": text, "label": "red"}) + "\n")


def prompts_of(spec: Spec) -> list[str]:
    with open(spec.prompt_file, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f]


# ---------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory of this process tree while its system takes a step (`watch` to `pause`),
    sampled every 20 ms. On CUDA: NVML's per-process usage (SGLang's scheduler processes
    included); where NVML reports process ids of another namespace (containers), the device's
    used memory above `baseline` instead, which then also holds the other system's idle tensors.
    On the CPU: the resident set. `peak_own`: this process's share at the moment of the peak
    (the rest is its children's: SGLang's scheduler, vLLM's workers), where usage is per
    process.

    Between steps the sampler rests: side by side, the systems step in turn, and an idle
    system's sampler would only load the host (NVML's process list and a walk of ``/proc``, 50
    times a second) under the one being timed. The process tree is listed again at each `watch`
    and at most once a second while watching."""

    INTERVAL_S = 0.02
    PIDS_MAX_AGE_S = 1.0

    def __init__(self, device: str, baseline: int) -> None:
        import psutil

        self.cuda = device.startswith("cuda")
        self.baseline = baseline
        self.process = psutil.Process()
        self.peak = 0
        self.peak_own = 0
        self.per_process = not self.cuda
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the sampler's and `pause`'s samples, `_watching`
        self._watching = False
        self._pids: set[int] = set()
        self._pids_at = float("-inf")
        self._handle: Any = None
        if self.cuda:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> set[int]:
        if time.monotonic() - self._pids_at > self.PIDS_MAX_AGE_S:
            children = self.process.children(recursive=True)
            self._pids = {self.process.pid, *(c.pid for c in children)}
            self._pids_at = time.monotonic()
        return self._pids

    def sample(self) -> tuple[int, int]:
        """Bytes in use by the process tree, and by this process alone (0 where unknown)."""
        pids = self._tree()
        if not self.cuda:
            import psutil

            used = {}
            for pid in pids:
                try:
                    used[pid] = psutil.Process(pid).memory_info().rss
                except psutil.NoSuchProcess:
                    continue
            return sum(used.values()), used.get(self.process.pid, 0)
        import pynvml

        used = {
            p.pid: p.usedGpuMemory or 0
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            if p.pid in pids
        }
        self.per_process = self.per_process or bool(used)
        if self.per_process:
            return sum(used.values()), used.get(self.process.pid, 0)
        return pynvml.nvmlDeviceGetMemoryInfo(self._handle).used - self.baseline, 0

    def _record(self) -> None:
        try:
            total, own = self.sample()
        except Exception:  # a process that ended between listing and reading it
            return
        if total > self.peak:
            self.peak, self.peak_own = total, own

    def watch(self) -> None:
        """A step begins: sample until `pause`."""
        with self._lock:
            self._pids_at = float("-inf")
            self._watching = True

    def pause(self) -> None:
        """The step has ended: one last sample, then none until the next `watch`."""
        with self._lock:
            self._watching = False
            self._record()

    def idle(self) -> None:
        """Between steps (untimed): hand cached blocks back to the device, so that the systems
        stepping in turn find the memory another one's caching allocator would hold (three side
        by side overflowed an H200: 2026-12-04), and without per-process numbers the other
        systems' samples count only this one's live tensors."""
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            with self._lock:
                if self._watching:
                    self._record()

    def reset(self) -> None:
        with self._lock:
            self.peak = self.peak_own = 0

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def device_used(device: str) -> int:
    """Bytes in use on GPU 0 (0 on the CPU)."""
    if not device.startswith("cuda"):
        return 0
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


# ---------------------------------------------------------------------------- ours


class InProcessTrainers:
    """A one-rank `TrainerGroup` over a policy trainer in this process."""

    world_size = 1

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def forward(self, shards: Any, *, with_adapter: bool) -> Any:
        return [[self.trainer.forward(b, with_adapter=with_adapter) for b in shards[0]]]

    def train_step(self, shards: Any, loss_fn: Any) -> Any:
        return [self.trainer.train_step(shards[0], loss_fn)]

    def export_adapter(self) -> Any:
        return self.trainer.export_adapter()

    def adapter_digests(self) -> list[str]:
        from trainer.backends.base import adapter_digest

        return [adapter_digest(self.trainer.export_adapter())]

    def save(self, path: Path) -> None:
        self.trainer.save(path)

    def load(self, path: Path) -> None:
        self.trainer.load(path)

    def release_memory(self) -> None:
        self.trainer.release_memory()

    def resume_memory(self) -> None:
        self.trainer.resume_memory()


def kv_cache_tokens(spec: Spec) -> int:
    """Ours' SGLang KV cache in tokens (``--sglang-max-total-tokens``): every sample of a step
    whole, prompt and response, with a quarter to spare. The static fraction alone would
    reserve about 21 GiB of an H200 for what needs 5.3 GiB at the 0.6B shape."""
    return math.ceil(1.25 * spec.prompts * spec.samples * (spec.prompt_len + spec.response_len))


def sglang_flags(spec: Spec) -> list[str]:
    """Ours' SGLang flags but its fraction (`SGLANG_FRACTION`, else `engine_fraction`)."""
    return [*shlex.split(SGLANG_FLAGS), "--sglang-max-total-tokens", str(kv_cache_tokens(spec))]


def engine_fraction(spec: Spec, config: TrainConfig, free: int) -> float:
    """Ours' ``--sglang-mem-fraction-static`` when `free` bytes of the GPU are free: at least
    `SGLANG_FRACTION`, and as much as SGLang needs to size a KV cache of the step's samples
    (`kv_cache_tokens`) up to `SGLANG_FRACTION_MAX`. At the Qwen3-4B shape on an 80 GB GPU 0.15
    holds 31,293 of the 49,152 tokens the step's samples reach, and SGLang would decode them in
    turns (`memory_estimate.sglang_kv_tokens`)."""
    from trainer.backends import registry
    from trainer.backends.sglang.args import LORA_SLOTS
    from trainer.job import memory_estimate, model_shape

    shape = model_shape.read(
        Path(spec.model_dir),
        lora_rank=config.lora.lora_rank,
        lora_targets=registry.adapter_targets(config).hf,
    )
    needed = memory_estimate.sglang_fraction(
        shape,
        kv_tokens=kv_cache_tokens(spec),
        free=free,
        dtype_bytes=2,
        adapter_slots=0 if config.lora.merged else LORA_SLOTS,
    )
    return min(SGLANG_FRACTION_MAX, max(SGLANG_FRACTION, needed))


def ours_config(
    spec: Spec,
    steps: int,
    memory: Callable[[], DeviceMemory],
    extra: tuple[str, ...] = (),
) -> TrainConfig:
    """Ours' train.py config (`ours_argv` and `extra`) with SGLang's memory sized on its GPU,
    whose memory `memory` measures (`engine_fraction`), unless `--ours-flags` or `extra` set
    the fraction."""
    from dataclasses import replace

    from trainer.arguments import parse_args

    flags = [*spec.ours_flags, *extra]
    config = parse_args([*ours_argv(spec, steps), *extra])
    chosen = any(flag.split("=", 1)[0] == FRACTION_FLAG for flag in flags)
    if config.placement.rollout_backend != "sglang" or chosen:
        return config
    fraction = engine_fraction(spec, config, memory().free)
    if fraction != SGLANG_FRACTION:
        print(f"ours: {FRACTION_FLAG} {fraction:g}, which holds a step's KV cache")
    return replace(config, sglang=replace(config.sglang, sglang_mem_fraction_static=fraction))


def ours_argv(spec: Spec, steps: int) -> list[str]:
    cuda = spec.device.startswith("cuda")
    argv = [
        "--hf-checkpoint", spec.model_dir, "--prompt-data", spec.prompt_file,
        "--custom-rm-path", "trainer.tiny.length_parity", "--num-rollout", str(steps),
        "--rollout-batch-size", str(spec.prompts), "--n-samples-per-prompt", str(spec.samples),
        "--rollout-max-response-len", str(spec.response_len),
        "--global-batch-size", str(spec.prompts * spec.samples),
        "--micro-batch-size", str(spec.micro_batch),
        "--lora-rank", "64", "--lora-alpha", "32", "--lora-dropout", "0",
        "--target-modules", "all-linear", "--lr", str(spec.lr), "--adam-beta2", "0.999",
        "--calculate-per-token-loss",  # token mean over the step, as TRL's "dapo" loss
        "--train-backend", "torch", "--rollout-backend", spec.rollout_backend,
        "--device", "cuda" if cuda else "cpu", "--dtype", "bf16" if cuda else "fp32",
        "--seed", str(spec.seed), "--output-dir", str(Path(spec.work) / "ours"),
    ]  # fmt: skip
    if cuda:
        argv.append("--colocate")
    if spec.gradient_checkpointing:
        argv.append("--gradient-checkpointing")
    if spec.rollout_backend == "sglang":
        argv += [*sglang_flags(spec), FRACTION_FLAG, str(SGLANG_FRACTION)]
        argv += OURS_MEMORY[spec.ours_memory]
    return argv + spec.ours_flags


def device_memory(device: str) -> DeviceMemory:
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(free=int(free), total=int(total))


class Ours:
    def __init__(self, spec: Spec, steps: int) -> None:
        from transformers import AutoTokenizer

        from trainer.backends import registry, shared_base
        from trainer.backends.colocate import Colocation
        from trainer.job import colocate_memory
        from trainer.loop import GRPOLoop
        from trainer.run.data import rollout_source
        from trainer.run.metrics import MetricsLogger

        self.spec = spec
        device = "cuda:0" if spec.device.startswith("cuda") else "cpu"
        memory = functools.partial(device_memory, device)
        args = ours_config(spec, steps, memory)
        args = colocate_memory.resolve(
            args,
            colocate_memory.model_shape_for(args),
            device=device.split(":")[0],
            device_memory=memory,
        )
        tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        colocation = Colocation.start_engines_first(
            lambda: registry.create_rollout(args, device),
            lambda: InProcessTrainers(registry.create_trainer(args, device, total_steps=steps)),
            colocate=args.placement.swaps_memory,
        )
        if shared_base.lends_base(args, device):  # as train.py's placement does
            colocation.engine.borrow_base(colocation.trainer.trainer.merged_base())
        self.loop = GRPOLoop(
            args,
            trainers=colocation.trainer,
            engines=colocation.engine,
            tokenizer=tokenizer,
            source=rollout_source(args, tokenizer),
            eval_sets={},
            logger_factory=lambda start, total: MetricsLogger(
                Path(args.checkpoint.output_dir), total_steps=total, start_step=start
            ),
            colocation=colocation,
        )
        self.next = 0

    def step(self) -> StepTime:
        synchronize(self.spec.device)
        started = time.perf_counter()
        metrics = self.loop.step(self.next)
        synchronize(self.spec.device)
        elapsed = time.perf_counter() - started
        self.next += 1
        rows = self.spec.prompts * self.spec.samples
        responses = round(metrics["rollout/response_len_mean"] * rows)
        return StepTime(
            step_s=elapsed,
            rollout_s=metrics["time/rollout"],
            response_tokens=responses,
            total_tokens=responses + rows * self.spec.prompt_len,
            phases={
                key.removeprefix("time/"): value
                for key, value in metrics.items()
                if key.startswith("time/") or key.startswith("sync/")
            },
        )

    def close(self) -> None:
        shutdown = getattr(self.loop.engines, "shutdown", None)
        if shutdown is not None:
            shutdown()


# ---------------------------------------------------------------------------- TRL


def trl_config(spec: Spec, steps: int, kind: str) -> Any:
    """The GRPOConfig of `kind` ("trl", "trl-vllm" or "unsloth"): the same workload, generated
    by transformers or by vLLM colocated (see the module's docstring). For "unsloth", TRL's
    GRPOConfig as importing Unsloth patches it: vLLM is the model's own `fast_inference`
    engine, which Unsloth sizes and never puts to sleep."""
    from trl import GRPOConfig

    cuda = spec.device.startswith("cuda")
    rows = spec.prompts * spec.samples
    accumulation = rows // spec.micro_batch
    if kind in ADAPTER_PHASE:
        eos = build_tokenizer(spec, eos=True).eos_token_id
        generation: dict[str, Any] = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_enable_sleep_mode": spec.vllm_sleep and kind == "trl-vllm",
            "generation_kwargs": {"min_tokens": spec.response_len, "stop_token_ids": [eos]},
        }
        if kind == "trl-vllm" and spec.vllm_memory is not None:
            generation["vllm_gpu_memory_utilization"] = spec.vllm_memory
    else:
        generation = {"use_vllm": False, "generation_kwargs": {"min_new_tokens": spec.response_len}}
    return GRPOConfig(
        output_dir=str(Path(spec.work) / "trl"),
        learning_rate=spec.lr,
        per_device_train_batch_size=spec.micro_batch,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_iterations=1,
        num_generations=spec.samples,
        max_completion_length=spec.response_len,
        temperature=1.0,
        beta=0.0,
        bf16=cuda,
        gradient_checkpointing=spec.gradient_checkpointing and kind != "unsloth",
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=spec.seed,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        **generation,
    )


def unsloth_model_kwargs(spec: Spec) -> dict[str, Any]:
    """`FastLanguageModel.from_pretrained`'s arguments: the random-weight model in bf16, not
    quantized, vLLM in process (`fast_inference`) for rank-64 adapters. `fix_tokenizer` off: the
    word-level tokenizer is complete as built (pad set, no EOS by design), nothing to repair."""
    import torch

    return {
        "model_name": spec.model_dir,
        "max_seq_length": spec.prompt_len + spec.response_len,
        "dtype": torch.bfloat16,
        "load_in_4bit": False,
        "fast_inference": True,
        "max_lora_rank": 64,
        "gpu_memory_utilization": UNSLOTH_VLLM_MEMORY
        if spec.vllm_memory is None
        else spec.vllm_memory,
        "fix_tokenizer": False,
        "random_state": spec.seed,
    }


def unsloth_lora_kwargs(spec: Spec) -> dict[str, Any]:
    """`FastLanguageModel.get_peft_model`'s arguments: the workload's adapter."""
    return {
        "r": 64,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "target_modules": TARGETS,
        "bias": "none",
        "use_gradient_checkpointing": "unsloth" if spec.gradient_checkpointing else False,
        "random_state": spec.seed,
    }


def unsloth_model(spec: Spec) -> Any:
    """Unsloth's model with its adapter and its vLLM engine. Imported before TRL, as Unsloth
    asks: importing it patches TRL's GRPOTrainer and GRPOConfig."""
    from unsloth import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(**unsloth_model_kwargs(spec))
    return FastLanguageModel.get_peft_model(model, **unsloth_lora_kwargs(spec))


def run_trl(spec: Spec, kind: str, steps: int, conn: Any, memory: PeakMemory) -> None:
    """TRL's own training loop (for "unsloth", as Unsloth patches it), paced by the parent:
    each step waits for its "step" command."""
    model = unsloth_model(spec) if kind == "unsloth" else None
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    cuda = spec.device.startswith("cuda")
    tokenizer = build_tokenizer(spec, eos=True)
    tokenizer.padding_side = "left"
    dtype = torch.bfloat16 if cuda else torch.float32
    peft_config = None  # Unsloth's adapter is in place already
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=dtype).to(spec.device)
        peft_config = LoraConfig(
            r=64, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"
        )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    dataset = datasets.Dataset.from_dict({"prompt": prompts_of(spec)})
    # a step's times; the adapter's hand-over may run before the first step (at start-up) too
    timing: dict[str, float] = {"sync": 0.0}

    class Pace(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            command = conn.recv()
            if command == "reset":
                memory.reset()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                command = conn.recv()
            assert command == "step", command
            memory.watch()
            synchronize(spec.device)
            timing.update(started=time.perf_counter(), rollout=0.0, sync=0.0, responses=0)

        def on_step_end(self, *_: Any, **__: Any) -> None:
            synchronize(spec.device)
            rows = spec.prompts * spec.samples
            responses = int(timing["responses"])
            step = StepTime(
                step_s=time.perf_counter() - timing["started"],
                rollout_s=timing["rollout"] - timing["sync"],
                response_tokens=responses,
                total_tokens=responses + rows * spec.prompt_len,
                phases={ADAPTER_PHASE[kind]: timing["sync"]} if kind in ADAPTER_PHASE else {},
            )
            memory.pause()
            memory.idle()
            conn.send(asdict(step))

    def timed(call: Any, phase: str) -> Any:
        """`call` with its time (the device synchronized) added to the step's `phase`."""

        def run(*args: Any, **kwargs: Any) -> Any:
            synchronize(spec.device)
            started = time.perf_counter()
            out = call(*args, **kwargs)
            synchronize(spec.device)
            timing[phase] += time.perf_counter() - started
            return out

        return run

    def length_parity(completions: list[str], **_: Any) -> list[float]:
        return [parity(completion) for completion in completions]

    if kind == "unsloth":  # within the rollout: Unsloth hands the adapter to vLLM
        model.load_lora = timed(model.load_lora, "sync")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_parity,
        args=trl_config(spec, steps, kind),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[Pace()],
    )
    generate = timed(trainer._generate_single_turn, "rollout")  # model.generate, or vLLM's

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        out = generate(*args, **kwargs)
        timing["responses"] += sum(len(ids) for ids in out[0])
        return out

    trainer._generate_single_turn = timed_generate
    if kind == "trl-vllm":  # within the rollout: the adapter merged into vLLM's weights
        trainer.vllm_generation.sync_weights = timed(trainer.vllm_generation.sync_weights, "sync")
    trainer.remove_callback(PrinterCallback)  # TRL's per-step log dicts on stdout
    conn.send(("ready", package_versions()))
    trainer.train()


# ---------------------------------------------------------------------------- workers


def use_path(path: list[str]) -> None:
    """Put `path` first on this process's `sys.path` and, for the processes it starts (SGLang's
    scheduler), on `PYTHONPATH`."""
    if path:
        sys.path[:0] = path
        rest = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(path + ([rest] if rest else []))


def package_versions() -> dict[str, str]:
    """The versions of the packages the systems are made of, as this process finds them."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    names = ("torch", "transformers", "peft", "trl", "datasets", "sglang", "vllm")
    for name in (*names, "unsloth", "unsloth_zoo", "verl", "ray"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def worker(kind: str, spec: Spec, steps: int, baseline: int, path: list[str], conn: Any) -> None:
    use_path(path)  # before the systems' packages: this module's top imports none of them
    from trainer.arguments import UsageError

    try:
        import torch

        memory = PeakMemory(spec.device, baseline)
        allocated = None
        if kind in ("trl", "trl-vllm", "unsloth"):
            run_trl(spec, kind, steps, conn, memory)
        elif kind == "verl":
            from benchmarks import verl_system

            versions = package_versions()
            allocated = verl_system.run(spec, steps, conn, memory, versions, prompts_of(spec))
        else:
            system = Ours(spec, steps)
            try:
                conn.send(("ready", package_versions()))
                for _ in range(steps):
                    command = conn.recv()
                    if command == "reset":
                        memory.reset()
                        if spec.device.startswith("cuda"):
                            torch.cuda.reset_peak_memory_stats()
                        command = conn.recv()
                    memory.watch()
                    step = system.step()
                    memory.pause()
                    memory.idle()
                    conn.send(asdict(step))
            finally:  # SGLang's engine processes end with it, on a failure too
                system.close()
        reserved = None  # verl's actor is in Ray's processes: it says its allocated peak only
        if allocated is None:
            cuda = spec.device.startswith("cuda")
            allocated = torch.cuda.max_memory_allocated() if cuda else 0
            reserved = torch.cuda.max_memory_reserved() if cuda else None
        peak = memory.stop()
        conn.send(("memory", peak, memory.peak_own, allocated, reserved, memory.per_process))
    except UsageError as err:  # ours' argv, e.g. a bad --ours-flags: one line
        conn.send(("usage", f"train.py flags: {err}"))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        raise


class WorkerFailed(Exception):
    """A system's worker raised (its traceback) or died without a result."""

    def __init__(self, kind: str, details: str) -> None:
        super().__init__(f"the {kind} worker failed:\n{details.rstrip()}")
        self.kind = kind
        self.details = details.rstrip()

    @property
    def reason(self) -> str:
        """The traceback's last line: the exception (e.g. CUDA's out of memory)."""
        return self.details.splitlines()[-1] if self.details else "no details"


# how the systems say that the GPU is too small: torch's allocator, and vLLM's start-up when its
# share leaves no room for the KV cache
OUT_OF_MEMORY = ("out of memory", "OutOfMemoryError", "No available memory for the cache blocks")


def out_of_memory(details: str) -> bool:
    """Whether a worker's traceback says the system did not fit the device."""
    return any(sign in details for sign in OUT_OF_MEMORY)


class Worker:
    """A system's worker process; `timeout` (``--step-timeout``): the longest wait for any
    one answer (its start, a step, its memory), None for no limit."""

    def __init__(
        self,
        kind: str,
        spec: Spec,
        steps: int,
        baseline: int,
        path: list[str],
        timeout: float | None = None,
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.kind = kind
        self.timeout = timeout
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=worker, args=(kind, spec, steps, baseline, path, child)
        )
        self.process.start()
        child.close()  # so that a worker that dies reads as EOF here, not as a wait forever
        try:
            _, self.versions = self.expect("ready")
        except WorkerFailed:
            self.stop()  # not yet in the caller's hands: nobody else would end it
            raise

    def receive(self) -> Any:
        if self.timeout is not None and not self.conn.poll(self.timeout):
            raise WorkerFailed(self.kind, f"no answer within {self.timeout:g} s (--step-timeout)")
        try:
            message = self.conn.recv()
        except EOFError:
            self.process.join(timeout=30)
            raise WorkerFailed(
                self.kind, f"exited (code {self.process.exitcode}) without a result"
            ) from None
        if isinstance(message, tuple) and message[0] == "usage":
            self.process.join(timeout=30)
            sys.exit(f"grpo_vs_trl: {message[1]}")
        if isinstance(message, tuple) and message[0] == "error":
            self.process.join(timeout=30)
            raise WorkerFailed(self.kind, message[1])
        return message

    def expect(self, tag: str) -> tuple[Any, ...]:
        message = self.receive()
        if not (isinstance(message, tuple) and message[0] == tag):
            sys.exit(f"grpo_vs_trl: the {self.kind} worker sent {message!r}, expected {tag}")
        return message

    def step(self, reset: bool = False) -> StepTime:
        if reset:
            self.conn.send("reset")
        self.conn.send("step")
        return StepTime(**self.receive())  # plain dicts cross the pipe, not __mp_main__ classes

    def finish(self) -> tuple[int, int, int, int | None, bool]:
        _, peak, peak_own, allocated, reserved, per_process = self.expect("memory")
        self.process.join(timeout=120)
        return peak, peak_own, allocated, reserved, per_process

    def stop(self) -> None:
        """End the worker process if it still runs (a failure elsewhere left it waiting, or it
        hung), and every process it started: an engine's, or the Ray cluster verl starts, would
        otherwise keep their GPU memory from the next system."""
        if self.process.is_alive():
            started = descendants(self.process.pid)
            self.process.terminate()
            self.process.join(timeout=30)
            end(started)
        self.process.join(timeout=60)


def descendants(pid: int) -> list[Any]:
    """The processes `pid` started, and theirs (psutil's), or none where psutil is missing
    here (then only the worker is ended)."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def end(processes: list[Any]) -> None:
    """Kill `processes` (psutil's) that still run, and wait for them."""
    if not processes:
        return
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=30)


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


def missing_packages(spec: Spec, paths: dict[str, list[str]]) -> list[str]:
    """'module for system (how to install it)' for every module a system's worker needs and
    cannot import, with its `--SYSTEM-path` first."""
    missing = []
    for kind, path in paths.items():
        for module in needed_modules(spec, kind):
            if PathFinder.find_spec(module, path) is None and find_spec(module) is None:
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
            help=f"directories ({os.pathsep}-separated) first on {kind}'s sys.path and PYTHONPATH",
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
        "the engine's KV cache and CUDA graphs only (release-kv), engine and trainer both "
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
    options.paths = {kind: own_path(options, kind) for kind in systems}
    for kind in SYSTEMS:
        for folder in own_path(options, kind):
            if not Path(folder).is_dir():
                parser.error(f"--{kind}-path: {folder} is not a directory")
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
        inputs=str(options.inputs.resolve()) if options.inputs else "",
    )
    if spec.prompt_len + spec.response_len > spec.max_positions:
        model = "the tiny model" if spec.tiny else f"the {spec.shape} shape"
        parser.error(
            f"--prompt-len {spec.prompt_len} + --response-len {spec.response_len} tokens: over "
            f"the {spec.max_positions} positions of {model}"
        )
    missing = missing_packages(spec, options.paths)
    if missing:
        parser.exit(
            2,
            f"{parser.prog}: error: missing Python packages: {'; '.join(missing)}\n",
        )
    if "verl" in options.paths:
        from benchmarks.verl_system import peft_problem

        problem = peft_problem(options.paths["verl"])
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
    try:
        document = json.loads(options.json.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {options.json}: {err}") from None
    if (
        not isinstance(document, dict)
        or not document.get("one_at_a_time")
        or not isinstance(document.get("results"), dict)
    ):
        raise ValueError(f"{options.json} is not the JSON of a --one-at-a-time run")
    if document.get("machine") != machine(spec):
        raise ValueError(
            f"{options.json} ran on {document.get('machine', 'an unnamed machine')}, "
            f"not on this {machine(spec)}"
        )
    now = {key: value for key, value in asdict(spec).items() if key not in RUN_LOCAL}
    then = document.get("spec", {})
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
    total = options.warmup + max(options.steps.values())
    with tempfile.TemporaryDirectory(prefix="grpo-vs-trl-") as work:
        spec.work = work
        print(prepare_inputs(spec, rows=spec.prompts * (total + 2)), flush=True)
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


def saved_report(path: Path, hbm_tbps: float | None) -> None:
    """Print the report of a run's `--json` document (one whose own report a node's time limit
    cut, say), on any machine: the device and the workload are the document's."""
    try:
        document = json.loads(path.read_text())
        spec = Spec(**document["spec"])
        results = document["results"]
        report(
            spec,
            results,
            hbm_tbps,
            machine=document["machine"],
            alone=document["one_at_a_time"],
        )
    except KeyError as err:
        raise ValueError(f"{path} has no {err.args[0]!r}: not a --json of this version") from None
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"cannot read {path} as a --json of this version: {err}") from None
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
    peak, peak_own, allocated, reserved, per_process = w.finish()
    return {
        "times": [asdict(t) for t in times],
        "summary": summary(times),
        "peak": peak,
        "peak_own": peak_own,
        "allocated": allocated,
        "reserved": reserved,
        "per_process": per_process,
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
