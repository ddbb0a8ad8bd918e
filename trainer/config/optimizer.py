"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag, fraction, non_negative, positive


@dataclass(frozen=True)
class OptimizerConfig:
    TITLE = "optimizer"

    optimizer: str = flag(
        "adam",
        choices=("adam",),
        help="Adam with decoupled weight decay (torch's AdamW; Megatron's distributed Adam), "
        "over the adapter's parameters only",
    )
    lr: float = flag(1e-5, help="peak learning rate (miles: 1e-6)")
    lr_decay_style: str = flag(
        "constant",
        choices=("constant", "cosine", "linear"),
        help="how the learning rate falls from --lr to --min-lr over the run's optimizer steps "
        "after warmup (miles: linear)",
    )
    lr_warmup_iters: int = flag(
        0, help="optimizer steps of linear warmup to --lr at the start of the run"
    )
    min_lr: float = flag(0.0, help="learning rate at the end of a cosine or linear decay")
    weight_decay: float = flag(
        0.0, help="decoupled (AdamW) weight decay of the adapter's parameters (miles: 0.01)"
    )
    adam_beta1: float = flag(0.9, help="Adam's decay rate of the running mean of the gradients")
    adam_beta2: float = flag(
        0.98, help="Adam's decay rate of the running mean of the squared gradients (miles: 0.999)"
    )
    adam_eps: float = flag(1e-8, help="Adam's term added to the denominator for stability")
    clip_grad: float = flag(1.0, help="max grad norm; 0 disables")

    def problems(self) -> Iterator[str]:
        yield from positive(self, "adam_eps")
        yield from non_negative(
            self, "lr", "min_lr", "weight_decay", "clip_grad", "lr_warmup_iters"
        )
        yield from fraction(self, "adam_beta1", "adam_beta2")
        if self.min_lr > self.lr:
            yield f"--min-lr ({self.min_lr}) must not exceed --lr ({self.lr})"
