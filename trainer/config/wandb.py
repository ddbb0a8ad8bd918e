"""Weights & Biases logging (the key travels as WANDB_API_KEY in the job's environment only)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from trainer.config.flags import flag


@dataclass(frozen=True)
class WandbConfig:
    TITLE = "wandb (the key comes from WANDB_API_KEY only)"

    use_wandb: bool = flag(
        False,
        help="log the metrics and the resolved config to Weights & Biases too (a resumed run "
        "continues its wandb run); metrics.jsonl is written either way",
    )
    wandb_project: str | None = flag(
        None, help="wandb project; unset: wandb's default (WANDB_PROJECT, if set)"
    )
    wandb_group: str | None = flag(
        None,
        help="wandb group of the run, as given (miles appends a random suffix and also names "
        "the run after it)",
    )
    wandb_run_name: str | None = flag(
        None, help="display name of the wandb run; unset: wandb makes one up"
    )
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
