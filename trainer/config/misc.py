"""The run's seed, ``--validate-only`` and the adapter-sync check."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag

MAX_SEED = 2**32 - 1  # numpy's and SGLang's seeds are 32-bit


@dataclass(frozen=True)
class MiscConfig:
    TITLE = "misc"

    seed: int = flag(
        1234,
        help="seed of the run: LoRA initialisation, prompt order, per-request sampling seeds and "
        "the engines' random state (SGLang: seed + engine index); a resume must keep it",
    )
    validate_only: bool = flag(False, help="print the resolved config as JSON and exit")
    check_adapter_sync: bool = flag(
        False,
        help="after every update, compare each engine's log-probs of a fixed sequence with the "
        "trainer's (metric sync/engine_trainer_logprob_abs_diff); needs --rollout-temperature 1",
    )

    def problems(self) -> Iterator[str]:
        if not 0 <= self.seed <= MAX_SEED:
            yield f"--seed must be in [0, {MAX_SEED}] (got {self.seed})"
