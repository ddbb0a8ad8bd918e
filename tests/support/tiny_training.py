"""Training inputs for the PEFT trainer's tests on the tiny model: an adapter moved away from
the base, micro-batches of random tokens, a loss that needs no rollout; and a count of the
operations a step dispatches."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainer.backends.base import ForwardOutput, TrainBatch
from trainer.backends.torch.trainer import PeftPolicyTrainer


def away_from_base(trainer: PeftPolicyTrainer) -> PeftPolicyTrainer:
    """`trainer` with every LoRA B random (the same for every call), so that its policy differs
    from the base."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in sorted(trainer.model.named_parameters()):
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return trainer


def micro_batches(lengths: list[int], prompt: int = 4) -> list[TrainBatch]:
    """One micro-batch of 2 rows of random tokens per length: `prompt` tokens, the rest the
    response."""
    generator = torch.Generator().manual_seed(2)
    batches = []
    for length in lengths:
        ids = torch.randint(3, 10, (2, length), generator=generator)
        loss_mask = torch.zeros(2, length - 1)
        loss_mask[:, prompt - 1 :] = 1
        batches.append(TrainBatch(ids, torch.ones_like(ids), loss_mask))
    return batches


def mean_logprob_loss(
    out: ForwardOutput, batch: TrainBatch
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Minus the mean log-probability of the response tokens."""
    mask = batch.loss_mask
    return -(out.logprobs * mask).sum() / mask.sum(), {}


class CountedOps(TorchDispatchMode):
    """Within, counts the aten operations for which `counted(func, args)` holds."""

    def __init__(self, counted: Callable[[Any, tuple[Any, ...]], bool]) -> None:
        super().__init__()
        self.counted = counted
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += self.counted(func, args)
        return func(*args, **(kwargs or {}))
