"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag, fraction, non_negative, positive


@dataclass(frozen=True)
class OptimizerConfig:
    TITLE = "optimizer"

    optimizer: str = flag("adam", choices=("adam",))
    lr: float = flag(1e-5)
    lr_decay_style: str = flag("constant", choices=("constant", "cosine", "linear"))
    lr_warmup_iters: int = flag(0)
    min_lr: float = flag(0.0)
    weight_decay: float = flag(0.0)
    adam_beta1: float = flag(0.9)
    adam_beta2: float = flag(0.98)
    adam_eps: float = flag(1e-8)
    clip_grad: float = flag(1.0, help="max grad norm; 0 disables")

    def problems(self) -> Iterator[str]:
        yield from positive(self, "adam_eps")
        yield from non_negative(
            self, "lr", "min_lr", "weight_decay", "clip_grad", "lr_warmup_iters"
        )
        yield from fraction(self, "adam_beta1", "adam_beta2")
        if self.min_lr > self.lr:
            yield f"--min-lr ({self.min_lr}) must not exceed --lr ({self.lr})"
