"""`benchmarks/grpo_vs_trl.py`'s `ours` system: this project's trainer (`train.py`'s loop, in
process), its SGLang engine's flags and share of the GPU, and its colocated memory."""

from __future__ import annotations

import functools
import math
import shlex
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.peak_memory import PeakMemory, synchronize
from benchmarks.workload import KV_CACHE_DTYPES, Spec, StepTime
from trainer.config import TrainConfig
from trainer.job.memory_estimate import DeviceMemory

if TYPE_CHECKING:
    from trainer.loop import PhaseObserver

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
# training (its weights and the trainer's base stay, which the engine merges from; nothing is
# copied); both sides resident all along; or train.py's estimate picks
OURS_MEMORY = {
    "release": ["--lora-base-cpu-backup"],
    "release-kv": ["--colocate-memory", "release"],
    "keep": ["--colocate-memory", "keep"],
    "auto": ["--colocate-memory", "auto", "--lora-base-cpu-backup"],
}


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


def step_tokens(spec: Spec) -> int:
    """Every sample of a step whole, prompt and response: what a KV cache holding them all at
    once holds."""
    return spec.prompts * spec.samples * (spec.prompt_len + spec.response_len)


def kv_cache_tokens(spec: Spec) -> int:
    """Ours' SGLang KV cache cap in tokens (``--sglang-max-total-tokens``): `step_tokens` with a
    quarter to spare. The static fraction alone would reserve about 21 GiB of an H200 for what
    needs 5.3 GiB at the 0.6B shape."""
    return math.ceil(1.25 * step_tokens(spec))


def sglang_flags(spec: Spec) -> list[str]:
    """Ours' SGLang flags but its fraction (`SGLANG_FRACTION`, else `engine_fraction`)."""
    flags = [*shlex.split(SGLANG_FLAGS), "--sglang-max-total-tokens", str(kv_cache_tokens(spec))]
    if spec.kv_cache_dtype != "auto":
        flags += ["--sglang-kv-cache-dtype", KV_CACHE_DTYPES[spec.kv_cache_dtype]]
    return flags


def engine_fraction(spec: Spec, config: TrainConfig, free: int) -> float:
    """Ours' ``--sglang-mem-fraction-static`` when `free` bytes of the GPU are free: at least
    `SGLANG_FRACTION`, and as much as SGLang needs to size a KV cache of the step's samples
    (`step_tokens`; the cap's spare above them is not reserved) up to `SGLANG_FRACTION_MAX`. At
    the Qwen3-4B shape on an 80 GB GPU 0.15 holds about 24,000 of the 49,152 tokens the step's
    samples reach, and SGLang would decode them in turns
    (`memory_estimate.EngineSize.sglang_kv_tokens`). The KV cache in the format `config` gives
    SGLang (``--kv-cache-dtype``, or ``--sglang-kv-cache-dtype`` in ``--ours-flags``)."""
    from trainer.backends import registry
    from trainer.backends.sglang import kv_format
    from trainer.backends.sglang.args import LORA_SLOTS, coerce_extra
    from trainer.job import memory_estimate, model_shape

    shape = model_shape.read(
        Path(spec.model_dir),
        lora_rank=config.lora.lora_rank,
        lora_targets=registry.adapter_targets(config).hf,
    )
    kv_cache_dtype = coerce_extra(config.sglang.sglang_extra).get("kv_cache_dtype")
    engine = memory_estimate.EngineSize(
        shape,
        dtype_bytes=2,
        adapter_slots=0 if config.lora.merged else LORA_SLOTS,
        kv_element_bytes=kv_format.element_bytes(kv_cache_dtype, 2),
    )
    needed = engine.sglang_fraction(kv_tokens=step_tokens(spec), free=free)
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
    if fraction == SGLANG_FRACTION_MAX:  # train.py's plan says what its KV cache holds
        print(f"ours: {FRACTION_FLAG} {fraction:g}, the most it is given: a step's KV cache may "
              "not fit, and SGLang then decodes the samples in turns")  # fmt: skip
    elif fraction != SGLANG_FRACTION:
        print(f"ours: {FRACTION_FLAG} {fraction:g}, which holds a step's KV cache")
    return replace(config, sglang=replace(config.sglang, sglang_mem_fraction_static=fraction))


def ours_argv(spec: Spec, steps: int) -> list[str]:
    cuda = spec.device.startswith("cuda")
    argv = [
        "--hf-checkpoint", spec.model_dir, "--prompt-data", spec.prompt_file,
        "--custom-rm-path", "trainer.tiny.length_parity", "--num-rollout", str(steps),
        "--rollout-batch-size", str(spec.prompts), "--n-samples-per-prompt", str(spec.samples),
        "--rollout-max-prompt-len", str(spec.prompt_len),
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


def memory_phases(memory: PeakMemory) -> PhaseObserver:
    """The loop's timed phases as `memory`'s (`GRPOLoop`'s `observe_phase`). Its "step" spans
    what `PeakMemory.watch` does: within it, the time outside every other phase is the rest."""
    return lambda name: nullcontext() if name == "step" else memory.phase(name)


class Ours:
    def __init__(
        self,
        spec: Spec,
        steps: int,
        observe_phase: PhaseObserver | None = None,
    ) -> None:
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
            print(f"ours: {shared_base.LENT}", flush=True)
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
            observe_phase=observe_phase,
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
