"""Training batches: samples per optimizer step, and their micro-batches."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainer.config.flags import flag, positive


@dataclass(frozen=True)
class BatchConfig:
    TITLE = "training batches"

    global_batch_size: int | None = flag(
        None,
        help="samples per optimizer step, over all data-parallel ranks; default: all samples of "
        "a rollout (one update per rollout), or their share with --num-steps-per-rollout",
    )
    num_steps_per_rollout: int | None = flag(
        None,
        help="optimizer steps per rollout: sets --global-batch-size to the rollout's samples / N",
    )
    use_dynamic_global_batch_size: bool = flag(
        False,
        help="miles' flag, accepted as a check: the rollout's samples must already make one "
        "optimizer step (--global-batch-size); needs --use-dynamic-batch-size",
    )
    micro_batch_size: int = flag(
        1,
        help="samples per forward/backward pass on each data-parallel rank; gradients "
        "accumulate over a step's micro-batches (Megatron with --use-dynamic-batch-size packs "
        "by --max-tokens-per-gpu instead)",
    )
    balance_data: bool = flag(
        False,
        help="give each data-parallel rank a similar token count of every optimizer step "
        "(greedy, longest sample first; miles: Karmarkar-Karp); else consecutive slices",
    )

    def resolved(self, samples: int) -> BatchConfig:
        """`samples`: the rollout's samples, which the optimizer steps of a rollout share."""
        if self.global_batch_size is not None:
            return self
        steps = self.num_steps_per_rollout
        return replace(self, global_batch_size=samples // steps if steps else samples)

    def problems(self) -> Iterator[str]:
        yield from positive(self, "global_batch_size", "micro_batch_size", "num_steps_per_rollout")
