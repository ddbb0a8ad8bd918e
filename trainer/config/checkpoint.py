"""The base model, the checkpoints and the run's output directory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag, positive


@dataclass(frozen=True)
class CheckpointConfig:
    TITLE = "checkpoint"

    hf_checkpoint: str = flag(help="HF model directory (the base model)")
    load: str | None = flag(
        None, help="resume directory; a missing or empty directory starts fresh"
    )
    save: str | None = flag(None, help="checkpoint directory")
    save_interval: int | None = flag(None, help="save every N rollouts (and at the end)")
    output_dir: str = flag("./outputs", help="metrics.jsonl, summary, wandb dir")

    def problems(self) -> Iterator[str]:
        yield from positive(self, "save_interval")
        if self.save_interval is not None and not self.save:
            yield "--save-interval needs --save"
