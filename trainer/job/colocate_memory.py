"""What the job decides at start from its memory estimate (`trainer.job.memory_estimate`)
over the model, the batches and the device's memory: ``--colocate-memory auto`` (keep both
resident or release) and ``--gradient-checkpointing-layers auto`` (the fewest recomputed layers
whose trainer fits).

The model is sized before Ray starts (`model_shape_for`: a checkpoint without safetensors is a
usage error); the decisions come once the job knows its device (`resolve`). It returns the
config with ``release`` or ``keep`` in place of ``auto``, and a count of layers in place of the
other ``auto``: the engines, the trainers and the loop only ever see decided values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trainer.arguments import PROG
from trainer.backends import registry, shared_base
from trainer.backends.sglang import args as sglang_args
from trainer.backends.sglang import kv_format
from trainer.config import TrainConfig, torch_trainer
from trainer.errors import UsageError
from trainer.grpo.logprob_chunks import chunk_rows_for
from trainer.job import layer_activations, memory_estimate, model_shape
from trainer.job.memory_estimate import DeviceMemory, MemoryPlan, ModelShape


def colocate_undecided(config: TrainConfig) -> bool:
    return config.placement.colocate and config.placement.colocate_memory == "auto"


def layers_undecided(config: TrainConfig) -> bool:
    """``--gradient-checkpointing-layers auto``, which only the torch backend reads."""
    return (
        config.placement.train_backend == "torch"
        and config.torch.gradient_checkpointing_layers == torch_trainer.AUTO
    )


def undecided(config: TrainConfig) -> bool:
    return colocate_undecided(config) or layers_undecided(config)


def model_shape_for(config: TrainConfig) -> ModelShape | None:
    """The model's shape where an ``auto`` has to weigh it, else None. Raises `UsageError`."""
    if not undecided(config):
        return None
    try:
        return model_shape.read(
            Path(config.checkpoint.hf_checkpoint),
            lora_rank=config.lora.lora_rank,
            lora_targets=registry.adapter_targets(config).hf,
        )
    except model_shape.ModelShapeError as err:
        if colocate_undecided(config):
            raise UsageError(f"--colocate-memory auto: {err}; choose release or keep") from None
        raise UsageError(
            f"--gradient-checkpointing-layers auto: {err}; give it a number of layers"
        ) from None


def sequence_tokens(config: TrainConfig) -> int:
    """The longest sample: prompt (``--rollout-max-prompt-len``, else taken as long as the
    response) plus response."""
    response = config.rollout.rollout_max_response_len
    prompt = config.data.rollout_max_prompt_len or response
    return prompt + response


def engine_sequences(config: TrainConfig) -> int:
    """The samples one engine holds at once: its share of a round's prompts x samples."""
    rollout, placement = config.rollout, config.placement
    engines = (placement.rollout_num_gpus or 1) // placement.rollout_num_gpus_per_engine
    return math.ceil(rollout.over_sampling_batch_size * rollout.n_samples_per_prompt / engines)


def micro_batch_tokens(config: TrainConfig) -> int:
    megatron = config.megatron
    if (
        config.placement.train_backend == "megatron"
        and megatron.use_dynamic_batch_size
        and megatron.max_tokens_per_gpu
    ):
        return megatron.max_tokens_per_gpu
    return config.batch.micro_batch_size * sequence_tokens(config)


def recomputed_layers(config: TrainConfig, layers: int) -> int:
    """Of a model's `layers` decoder layers, how many recompute their activations in backward:
    Megatron's block method its ``--recompute-num-layers`` (per pipeline stage: counted whole,
    as the weights are), its other recompute settings every layer; the torch backend's
    ``--gradient-checkpointing-layers`` (-1: every layer)."""
    if config.placement.train_backend == "megatron":
        megatron = config.megatron
        if megatron.recompute_granularity is None:
            return 0
        if megatron.recompute_method == "block" and megatron.recompute_num_layers is not None:
            return min(megatron.recompute_num_layers, layers)
        return layers
    if not config.torch.gradient_checkpointing:
        return 0
    chosen = config.torch.checkpointed_layers
    return layers if chosen == -1 else min(chosen, layers)


def trainer_layer(config: TrainConfig) -> layer_activations.LayerActivations:
    """What a decoder layer keeps for backward on the trainer's path: Megatron's, or the
    torch backend's compiled or eager, training the merged policy or PEFT's."""
    if config.placement.train_backend == "megatron":
        return layer_activations.KORTHIKANTI
    return layer_activations.torch_layer(
        compiled=config.torch.torch_compile_layers, merged=config.lora.merged
    )


def logit_rows(config: TrainConfig) -> int | None:
    """The rows whose logits exist at once: the torch backend's chunk of log-probabilities,
    Megatron's whole micro-batch (None)."""
    if config.placement.train_backend == "megatron":
        return None
    return chunk_rows_for(config.torch.log_probs_chunk_size)


def sglang_engine(
    config: TrainConfig,
    shape: ModelShape,
    fraction: float,
    device: DeviceMemory,
    dtype_bytes: int,
) -> tuple[int, str]:
    """SGLang's share and how it was reckoned: its static `fraction` of the GPU, or less where
    ``--sglang-max-total-tokens`` caps its KV cache; and where the KV cache SGLang sizes from
    `fraction` holds fewer tokens than the rollout's samples at once, that too (SGLang then
    decodes them in turns, reading its weights once per turn's decode step). The KV cache in
    ``--sglang-kv-cache-dtype``'s format (`kv_format`)."""
    static = memory_estimate.static_engine_memory(fraction, device.total)
    source = f"--sglang-mem-fraction-static {fraction:g} of the GPU"
    extra = sglang_args.coerce_extra(config.sglang.sglang_extra)
    cap = extra.get("max_total_tokens")
    rollout = engine_sequences(config) * sequence_tokens(config)
    tokens = cap if cap is not None else rollout
    engine = memory_estimate.EngineSize(
        shape,
        dtype_bytes=dtype_bytes,
        adapter_slots=0 if config.lora.merged else sglang_args.LORA_SLOTS,
        kv_element_bytes=kv_format.element_bytes(extra.get("kv_cache_dtype"), dtype_bytes),
    )
    held = engine.sglang_kv_tokens(fraction=fraction, free=device.free)
    needed = min(tokens, rollout)
    if held < needed:
        enough = engine.sglang_fraction(kv_tokens=needed, free=device.free)
        return static, (
            f"{source}, whose KV cache holds {held} tokens, fewer than the {needed} of the "
            f"rollout's samples at once: SGLang runs them in turns (--sglang-mem-fraction-static "
            f"{enough:g} holds them)"
        )
    capped = engine.memory(tokens)
    if capped >= static:
        return static, source
    if cap is None:  # the rollout needs less than the fraction reserves: say how to cap it
        return static, (
            f"{source}, where its rollout needs {memory_estimate.gib(capped)} GiB: "
            f"--sglang-max-total-tokens {tokens} would cap its KV cache there"
        )
    return capped, (
        f"weights, {engine.adapter_slots} adapter slots and a KV cache of "
        f"--sglang-max-total-tokens {cap}, within {source}"
    )


def gpu_dtype_bytes(config: TrainConfig) -> int:
    """Bytes of the training dtype on a GPU."""
    return 4 if config.placement.resolve_dtype("cuda") == "fp32" else 2


def trainer_estimate(config: TrainConfig, shape: ModelShape) -> memory_estimate.TrainerMemory:
    """The trainer's share of the plan on one GPU."""
    return memory_estimate.trainer_memory(
        shape,
        dtype_bytes=gpu_dtype_bytes(config),
        tokens=micro_batch_tokens(config),
        layer=trainer_layer(config),
        logit_rows=logit_rows(config),
        recomputed_layers=recomputed_layers(config, shape.num_layers),
        kept_merged_weights=config.lora.merged and config.torch.keep_merged_weights,
    )


def released_engine(config: TrainConfig, shape: ModelShape) -> int:
    """What the colocated engine keeps on the GPU while it is released for training: SGLang its
    weights and, serving merged weights, the base its merges read unless the trainer lends it
    its own (`shared_base.lendable`), unless ``--lora-base-cpu-backup`` sends them to the host
    with its KV cache; the transformers engine nothing (its model goes to the host)."""
    placement = config.placement
    if (
        not placement.colocate
        or placement.rollout_backend != "sglang"
        or config.lora.lora_base_cpu_backup
    ):
        return 0
    dtype_bytes = gpu_dtype_bytes(config)
    merged = config.lora.merged
    slots = 0 if merged else sglang_args.LORA_SLOTS
    weights = memory_estimate.EngineSize(shape, dtype_bytes, adapter_slots=slots).resident
    # released without the backup, SGLang keeps its weights and the trainer its base: lent
    own_base = merged and not shared_base.lendable(config, "cuda")
    return weights + (shape.adapted_parameters * dtype_bytes if own_base else 0)


def estimate(config: TrainConfig, shape: ModelShape, *, device: DeviceMemory) -> MemoryPlan:
    """The plan for one GPU with `device`'s memory."""
    dtype_bytes = gpu_dtype_bytes(config)
    trainer = trainer_estimate(config, shape)
    fraction = config.sglang.sglang_mem_fraction_static
    if config.placement.rollout_backend == "sglang" and fraction is not None:
        engine, source = sglang_engine(config, shape, fraction, device, dtype_bytes)
    else:
        sequences = engine_sequences(config)
        engine = memory_estimate.EngineSize(shape, dtype_bytes).memory(
            sequences * sequence_tokens(config)
        )
        source = f"weights and the KV cache of {sequences} samples"
    if config.lora.merged:
        lent = shared_base.lendable(config, "cuda")  # kept, on the GPU this plan weighs
        engine += memory_estimate.merged_serving_memory(
            shape, dtype_bytes=dtype_bytes, base_lent=lent
        )
        source += (
            ", + the adapted weights once, merged into the trainer's base (--lora-serving merged)"
            if lent
            else ", + the adapted weights twice to merge into (--lora-serving merged)"
        )
    return memory_estimate.plan(
        trainer,
        engine=engine,
        engine_source=source,
        device=device,
        released_engine=released_engine(config, shape),
    )


def _decided(config: TrainConfig, mode: str, layers: int | None) -> TrainConfig:
    """`config` with memory `mode` and, where given, `layers` recomputed."""
    placement = replace(config.placement, colocate_memory=mode)
    if layers is None:
        return replace(config, placement=placement)
    torch = replace(config.torch, gradient_checkpointing_layers=layers)
    return replace(config, placement=placement, torch=torch)


def _fits(config: TrainConfig, memory_plan: MemoryPlan) -> bool:
    if config.placement.colocate and config.placement.colocate_memory == "keep":
        return memory_plan.keep
    return memory_plan.trainer_fits


def choose(
    config: TrainConfig, shape: ModelShape, device: DeviceMemory
) -> tuple[TrainConfig, MemoryPlan]:
    """`config` decided for `device`, and its plan: ``--colocate-memory auto`` keeps both
    resident where they fit, else releases; ``--gradient-checkpointing-layers auto`` takes the
    fewest recomputed layers whose plan fits (kept memory first: no swaps). Raises `UsageError`
    where no count of layers fits."""
    modes = (
        ("keep", "release") if colocate_undecided(config) else (config.placement.colocate_memory,)
    )
    counts = range(shape.num_layers + 1) if layers_undecided(config) else (None,)

    for mode in modes:
        for layers in counts:
            decided = _decided(config, mode, layers)
            memory_plan = estimate(decided, shape, device=device)
            if _fits(decided, memory_plan):
                return decided, memory_plan
    if layers_undecided(config):  # the last tried recomputes every layer
        why = _none_fits(decided, memory_plan)
        raise UsageError(f"--gradient-checkpointing-layers auto: {why}")
    return decided, memory_plan


def _none_fits(config: TrainConfig, memory_plan: MemoryPlan) -> str:
    """Why even every layer recomputed does not fit, and what to change."""
    gib = memory_estimate.gib
    usable = f"{gib(memory_plan.available)} GiB usable on the GPU"
    if config.placement.colocate and config.placement.colocate_memory == "keep":
        return (
            f"with every layer recomputed trainer and engine need {gib(memory_plan.needed)} GiB "
            f"both resident, more than the {usable}; lower --micro-batch-size or release the "
            "engine's memory (--colocate-memory release)"
        )
    beside = memory_plan.released_engine
    kept = f" beside the {gib(beside)} GiB the released engine keeps" if beside else ""
    return (
        f"with every layer recomputed the trainer needs {gib(memory_plan.trainer.total)} GiB"
        f"{kept}, more than the {usable}; lower --micro-batch-size"
    )


def _layers_line(config: TrainConfig, memory_plan: MemoryPlan, layers: int) -> str:
    gib = memory_estimate.gib
    if not config.placement.colocate:
        where = "alone on its GPU"
    elif config.placement.colocate_memory == "keep":
        where = f"beside the engine, both resident ({gib(memory_plan.needed)} GiB)"
    elif memory_plan.released_engine:
        where = f"beside the {gib(memory_plan.released_engine)} GiB the released engine keeps"
    else:
        where = "while the engine is released"
    return (
        f"--gradient-checkpointing-layers auto: {recomputed_layers(config, layers)} of {layers} "
        f"decoder layers recomputed, the fewest whose trainer ({gib(memory_plan.trainer.total)} "
        f"GiB) fits {where} in {gib(memory_plan.available)} GiB usable"
    )


def resolve(
    config: TrainConfig,
    shape: ModelShape | None,
    *,
    device: str,
    device_memory: Callable[[], DeviceMemory],
) -> TrainConfig:
    """`config` with each ``auto`` decided (a line printed for each); `device_memory` measures
    a GPU's memory, called only where the GPU is weighed. On the CPU nothing is swapped (keep)
    and nothing weighed (every layer recomputed)."""
    if not undecided(config):
        return config
    if device == "cpu":
        decided = _decided(
            config,
            "keep" if colocate_undecided(config) else config.placement.colocate_memory,
            -1 if layers_undecided(config) else None,
        )
        if colocate_undecided(config):
            print(
                f"{PROG}: --colocate-memory auto: keep (on the CPU nothing is swapped)", flush=True
            )
        if layers_undecided(config):
            print(
                f"{PROG}: --gradient-checkpointing-layers auto: every layer (on the CPU nothing "
                "is weighed)",
                flush=True,
            )
        return decided
    if shape is None:
        raise ValueError("an auto of the memory plan on a GPU weighs the model's shape: none given")
    decided, memory_plan = choose(config, shape, device_memory())
    if colocate_undecided(config):
        print(f"{PROG}: {memory_plan.line()}", flush=True)
    if layers_undecided(config):
        print(f"{PROG}: {_layers_line(decided, memory_plan, shape.num_layers)}", flush=True)
    return decided
