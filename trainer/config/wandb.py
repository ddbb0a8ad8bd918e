"""Weights & Biases logging (the key travels as WANDB_API_KEY in the job's environment only)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from trainer.config.flags import flag


@dataclass(frozen=True)
class WandbConfig:
    TITLE = "wandb (the key comes from WANDB_API_KEY only)"

    use_wandb: bool = flag(False)
    wandb_project: str | None = flag(None)
    wandb_group: str | None = flag(None)
    wandb_run_name: str | None = flag(None)
    wandb_mode: str | None = flag(
        None,
        choices=("online", "offline", "disabled"),
        help="default: online when WANDB_API_KEY is set, else offline",
    )

    def resolved(self, environ: Mapping[str, str]) -> WandbConfig:
        if self.wandb_mode is not None:
            return self
        return replace(self, wandb_mode="online" if environ.get("WANDB_API_KEY") else "offline")

    def problems(self) -> Iterator[str]:
        """Nothing to check: every value is a name or one of the choices."""
        yield from ()
