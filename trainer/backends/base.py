"""The two narrow interfaces the GRPO loop talks to.

A *rollout engine* generates responses with per-token log-probabilities and takes LoRA adapter
updates; a *policy trainer* computes log-probabilities (with the adapter, or without it for the
reference policy), takes optimizer steps and exports its adapter. Portable backends (PEFT +
transformers) and production backends (Megatron-Bridge + SGLang) implement them; the loop never
knows which pair it runs. It drives the trainers' data-parallel ranks as one `TrainerGroup`
(`trainer.job.placement` provides them as Ray actors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


# Request seeds of one generate call are seed x stride + request index: distinct for every
# request of every call whose seeds differ, for calls of up to `SEED_STRIDE` requests.
SEED_STRIDE = 2**16


@dataclass(frozen=True)
class SamplingParams:
    """Sampling of one generate call. With a `seed`, request i of the call samples with
    `request_seed(i)`: one seed per sample, so the n samples of a prompt differ even where the
    engine samples deterministically from a request's seed. `first_request` is the index of the
    call's first request within a larger batch split over several engines."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    first_request: int = 0
    stop_token_ids: tuple[int, ...] = ()  # end a response, besides the model's EOS
    stop: tuple[str, ...] = ()  # stop strings: a response ends with the first one it produces

    def request_seed(self, index: int) -> int | None:
        if self.seed is None:
            return None
        request = self.first_request + index
        if request >= SEED_STRIDE:
            raise ValueError(f"request {request}: one generate call takes {SEED_STRIDE} at most")
        return (self.seed * SEED_STRIDE + request) % 2**63


@dataclass(frozen=True)
class Generation:
    """One sampled response: token ids, the engine's log-probability of each, truncation."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_logprobs: tuple[float, ...]
    truncated: bool


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter in memory, under Hugging Face PEFT parameter names.

    `tensors` maps PEFT state-dict names (``base_model.model...lora_A.weight``) to CPU tensors
    (the PEFT trainer's: views of one `FlatTensors` buffer, which travels as one tensor);
    `config` is the PEFT ``LoraConfig`` as a dict (what ``adapter_config.json`` holds).
    """

    tensors: Mapping[str, torch.Tensor]
    config: Mapping[str, Any]
    version: int = 0


def adapter_digest(adapter: LoraAdapter) -> str:
    """SHA-256 of an adapter's tensors (names, shapes, dtypes and bytes): data-parallel ranks
    that stay in step hold adapters with equal digests."""
    import hashlib

    import torch

    digest = hashlib.sha256()
    for name in sorted(adapter.tensors):
        tensor = adapter.tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@dataclass
class TrainBatch:
    """Right-padded sequences (prompt + response) for a policy trainer.

    `loss_mask` is 1 on response tokens that count towards the loss. Per-token tensors
    (`old_logprobs`, `ref_logprobs`, `advantages`) align with `input_ids[:, 1:]`, i.e. entry t
    belongs to the token at position t + 1, predicted from positions <= t.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    rollout_logprobs: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ForwardOutput:
    """Per-token log-probabilities (and entropies when asked), aligned with `input_ids[:, 1:]`.
    Only entries under the batch's `loss_mask` are read; a trainer may leave the others 0."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None


LossFn = Callable[[ForwardOutput, TrainBatch], tuple["torch.Tensor", dict[str, "torch.Tensor"]]]
"""Maps a micro-batch's forward output to (loss, metrics). The loss is already scaled for
accumulation over the step's micro-batches; the trainer only calls backward on it. The metrics
are 0-dim tensors where the loss was computed (a GPU's): reading them is the trainer's, once
per step, so that no micro-batch waits for the device."""


@dataclass(frozen=True)
class StepResult:
    grad_norm: float
    metrics: dict[str, float]


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]: ...

    def load_adapter(self, adapter: LoraAdapter) -> None: ...

    def score(self, token_ids: Sequence[int]) -> list[list[float]]:
        """Log-probabilities of ``token_ids[1:]``, each given the tokens before it, under the
        adapter being served (temperature 1): one list per engine serving behind this object."""
        ...

    def release_memory(self) -> None: ...

    def resume_weights(self) -> None:
        """After `release_memory`: the weights back, ready for `load_adapter`; the rest (KV
        cache, CUDA graphs) comes back with `resume_memory` (`trainer.backends.colocate`)."""
        ...

    def resume_memory(self) -> None: ...


@runtime_checkable
class PolicyTrainer(Protocol):
    def forward(
        self, batch: TrainBatch, *, with_adapter: bool, with_entropy: bool = False
    ) -> ForwardOutput: ...

    def train_step(self, micro_batches: Sequence[TrainBatch], loss_fn: LossFn) -> StepResult: ...

    def export_adapter(self) -> LoraAdapter: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...

    def release_memory(self) -> None: ...

    def resume_memory(self) -> None: ...


Shards = Sequence[Sequence[TrainBatch]]  # per data-parallel rank, its micro-batches


class TrainerGroup(Protocol):
    """`world_size` data-parallel ranks of one policy; ``shards[i]`` goes to rank i, and the
    results come back in rank order."""

    world_size: int

    def forward(self, shards: Shards, *, with_adapter: bool) -> list[list[ForwardOutput]]: ...

    def train_step(self, shards: Shards, loss_fn: LossFn) -> list[StepResult]: ...

    def export_adapter(self) -> LoraAdapter: ...

    def adapter_digests(self) -> list[str]:
        """`adapter_digest` of every rank's adapter, in rank order."""
        ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...

    def release_memory(self) -> None: ...

    def resume_memory(self) -> None: ...
