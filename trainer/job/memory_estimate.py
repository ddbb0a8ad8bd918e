"""Whether a colocated trainer and rollout engine fit one device together (``--colocate-memory
auto``): pure arithmetic over sizes, no torch and no device; the device's free and total memory
are passed in.

The trainer's estimate, per device (conservative: no tensor/pipeline split of the weights):

* the base weights in the training dtype (frozen: no gradient, no optimizer state);
* the LoRA parameters in float32 (PEFT's master copy), their float32 gradients and Adam's two
  float32 moments: 16 bytes per LoRA parameter;
* activations kept for backward: what one decoder layer keeps per token in 16-bit, by the path
  the trainer computes it with (`trainer.job.layer_activations`: counted for the torch
  backend's layer, eager or compiled, PEFT's LoRA or the merged policy; Korthikanti's 34 x
  hidden for Megatron's), twice that in float32; a layer whose activations are recomputed
  (gradient checkpointing) keeps its input alone, and backward recomputes one such layer's
  worth at a time, once the layers after it have freed theirs;
* float32 logits twice (the values and their gradient), of the rows whose logits exist at
  once: the torch backend's log-probabilities turn ``--log-probs-chunk-size`` rows at a time
  into logits (`trainer.grpo.logprobs`, whose backward holds one chunk's float32 logits and
  probabilities), Megatron's output layer the whole micro-batch's;
* training the merged policy with its merged weights kept for the step (``--lora-serving
  merged`` and ``--keep-merged-weights``, the default): the adapted weights once more in the
  training dtype (`trainer.backends.torch.merged_policy`).

A micro-batch holds ``--micro-batch-size`` sequences of the longest prompt plus the longest
response (or ``--max-tokens-per-gpu`` tokens with dynamic batching).

The engine's share: SGLang reserves ``--sglang-mem-fraction-static`` of the device's total
memory for its weights and KV cache, less where ``--sglang-max-total-tokens`` caps the cache
(weights, adapter buffers and that many tokens' K and V, in ``--sglang-kv-cache-dtype``'s
format, else the model's dtype); the transformers engine holds its weights and the KV cache of
its samples. Both resident fit in what is free on the device at the job's start (another
process's memory on a shared GPU is not ours to plan with) less `MARGIN` of its total (CUDA
context, NCCL buffers, allocator fragmentation); released, the trainer fits in it beside what
the engine keeps on the device (`MemoryPlan.trainer_fits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.job.layer_activations import LayerActivations, LayerWidths

GIB = 2**30
MARGIN = 0.10
LORA_BYTES_PER_PARAM = 4 + 4 + 2 * 4  # float32 weight, gradient, Adam's two moments
LOGIT_COPIES = 2  # float32 logits and their gradient
# What SGLang 0.5 captures within its static fraction before it sizes its KV cache from what is
# left: its CUDA graphs and attention workspaces. On an H100 at the Qwen3-4B shape (decode graphs
# up to 64 requests, FlashInfer) its KV cache came out 0.72 GiB under fraction x free - weights
# with a 16-bit cache and 0.56 GiB under in e4m3 (2026-12-06); rounded up.
SGLANG_CAPTURE_RESERVE = GIB


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of the model (`trainer.job.model_shape` reads it from a
    checkpoint)."""

    parameters: int
    lora_parameters: int
    layer: LayerWidths
    num_layers: int
    vocab_size: int
    adapted_parameters: int = 0  # of the weights LoRA adapts (a merged engine copies them)

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden

    @property
    def kv_bytes_per_token_16bit(self) -> int:
        """K and V of one token over all layers, in 16-bit."""
        return 2 * self.num_layers * self.layer.kv * 2


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory in bytes, as the driver reports it (``torch.cuda.mem_get_info``)."""

    free: int
    total: int


@dataclass(frozen=True)
class TrainerMemory:
    weights: int
    lora_states: int
    activations: int
    logits: int
    merged_weights: int = 0

    @property
    def total(self) -> int:
        return (
            self.weights + self.lora_states + self.activations + self.logits + self.merged_weights
        )


@dataclass(frozen=True)
class MemoryPlan:
    trainer: TrainerMemory
    engine: int
    engine_source: str  # how the engine's share was reckoned
    device: DeviceMemory
    released_engine: int = 0  # what a colocated engine keeps on the GPU while released

    @property
    def trainer_fits(self) -> bool:
        """The trainer fits beside what the released engine keeps (alone, apart)."""
        return self.trainer.total + self.released_engine <= self.available

    @property
    def available(self) -> int:
        return max(0, self.device.free - int(self.device.total * MARGIN))

    @property
    def needed(self) -> int:
        return self.trainer.total + self.engine

    @property
    def keep(self) -> bool:
        """Both resident: they fit the device's free memory less `MARGIN` of its total."""
        return self.needed <= self.available

    @property
    def mode(self) -> str:
        return "keep" if self.keep else "release"

    def line(self) -> str:
        t = self.trainer
        merged = f" + merged weights {gib(t.merged_weights)}" if t.merged_weights else ""
        return (
            f"--colocate-memory auto: {self.mode} (trainer {gib(t.total)} GiB = weights "
            f"{gib(t.weights)} + LoRA with grads and Adam {gib(t.lora_states)} + activations "
            f"{gib(t.activations)} + logits {gib(t.logits)}{merged}; engine {gib(self.engine)} GiB "
            f"({self.engine_source}); {gib(self.needed)} GiB needed, "
            f"{gib(self.available)} GiB usable: {gib(self.device.free)} GiB free of "
            f"{gib(self.device.total)} GiB less {MARGIN:.0%} of it)"
        )


def gib(size: int) -> str:
    return f"{size / GIB:.2f}"


def trainer_memory(
    shape: ModelShape,
    *,
    dtype_bytes: int,
    tokens: int,
    layer: LayerActivations,
    logit_rows: int | None = None,
    recomputed_layers: int = 0,
    kept_merged_weights: bool = False,
) -> TrainerMemory:
    """`tokens`: of one micro-batch; `dtype_bytes`: of the training dtype (2 bf16, 4 fp32);
    `layer`: what a decoder layer keeps for backward (`trainer.job.layer_activations`);
    `logit_rows`: the rows whose logits exist at once (None: the whole micro-batch's).
    `recomputed_layers`: decoder layers whose activations backward recomputes, at most the
    model's (0: none; all of them: gradient checkpointing of every layer).
    `kept_merged_weights`: the merged policy trains with one merged copy of each adapted weight
    kept for the step; merging in every pass instead adds nothing."""
    per_layer = layer.bytes_per_token(shape.layer) * tokens * dtype_bytes // 2
    layer_input = tokens * shape.hidden_size * dtype_bytes
    # backward runs from the last layer to the first, so the recomputed layers (the first ones,
    # as Megatron's block method and `--gradient-checkpointing-layers` choose) recompute one at
    # a time after the kept layers' activations are freed: at least one layer's worth
    kept = max(shape.num_layers - recomputed_layers, 1 if recomputed_layers else 0)
    activations = per_layer * kept + layer_input * recomputed_layers
    return TrainerMemory(
        weights=shape.parameters * dtype_bytes,
        lora_states=shape.lora_parameters * LORA_BYTES_PER_PARAM,
        activations=activations,
        logits=LOGIT_COPIES * min(tokens, logit_rows or tokens) * shape.vocab_size * 4,
        merged_weights=shape.adapted_parameters * dtype_bytes if kept_merged_weights else 0,
    )


def static_engine_memory(mem_fraction_static: float, device_total: int) -> int:
    """SGLang's reservation: its weights and KV cache within that fraction of the device."""
    return int(mem_fraction_static * device_total)


@dataclass(frozen=True)
class EngineSize:
    """What an engine's memory is made of: the model's `shape` in `dtype_bytes` per weight, the
    buffers of `adapter_slots` adapters (SGLang's LoRA slots; none serving merged weights), and
    a KV cache in `kv_element_bytes` per element (None: the model's dtype; 1: an 8-bit cache,
    ``--sglang-kv-cache-dtype fp8_e4m3``)."""

    shape: ModelShape
    dtype_bytes: int
    adapter_slots: int = 0
    kv_element_bytes: float | None = None

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token over all layers."""
        element = self.kv_element_bytes or self.dtype_bytes
        return self.shape.kv_bytes_per_token_16bit * element / 2

    @property
    def resident(self) -> int:
        """The weights and the adapter buffers: what the engine holds before any KV cache."""
        adapters = self.adapter_slots * self.shape.lora_parameters * self.dtype_bytes
        return self.shape.parameters * self.dtype_bytes + adapters

    def memory(self, kv_tokens: int) -> int:
        """The resident part and a KV cache of `kv_tokens` tokens: the transformers engine (its
        samples' tokens), or SGLang with its cache capped (``--sglang-max-total-tokens``), which
        stays bounded by its static reservation (`static_engine_memory`) all the same."""
        return self.resident + int(self.kv_bytes_per_token * kv_tokens)

    def sglang_kv_tokens(self, *, fraction: float, free: int) -> int:
        """The KV cache, in tokens, that SGLang sizes for itself at
        ``--sglang-mem-fraction-static fraction`` when `free` bytes are free as it starts:
        `fraction` of them less its resident part and `SGLANG_CAPTURE_RESERVE` (SGLang's
        reckoning: what is free once its weights are loaded and its graphs captured, less
        ``1 - fraction`` of what was free before)."""
        held = int(fraction * free) - self.resident - SGLANG_CAPTURE_RESERVE
        return int(max(0, held) // self.kv_bytes_per_token)

    def sglang_fraction(self, *, kv_tokens: int, free: int) -> float:
        """The least ``--sglang-mem-fraction-static``, in hundredths, at which SGLang sizes a
        KV cache of `kv_tokens` tokens (`sglang_kv_tokens`) when `free` bytes are free as it
        starts."""
        return math.ceil(100 * (self.memory(kv_tokens) + SGLANG_CAPTURE_RESERVE) / free) / 100


def merged_serving_memory(shape: ModelShape, *, dtype_bytes: int, base_lent: bool) -> int:
    """What an engine serving merged weights (``--lora-serving merged``) holds beside its own:
    the base of the adapted weights to merge into, unless the trainer lends its own
    (`base_lent`, `trainer.backends.shared_base`), and the merged set of one update."""
    return (1 if base_lent else 2) * shape.adapted_parameters * dtype_bytes


def plan(
    trainer: TrainerMemory,
    *,
    engine: int,
    engine_source: str,
    device: DeviceMemory,
    released_engine: int = 0,
) -> MemoryPlan:
    """Keep both resident where they fit the device's free memory less `MARGIN` of its total;
    else release."""
    return MemoryPlan(trainer, engine, engine_source, device, released_engine)
