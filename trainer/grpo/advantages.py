"""Advantage estimators, chosen by ``--advantage-estimator``: the rollout's rewards -> advantages.

An estimator is the algorithm's seam between the rollout and the loss. Given the rewards of a
rollout (the ``group_size`` samples of each prompt contiguous), the response lengths and which
responses were truncated, it returns one advantage per sample and its metrics; its class says
how the loss takes the PPO ratio (`sequence_ratio`: one per response, or one per token).

GRPO's pipeline: DAPO's soft overlong penalty added to the rewards (``--overlong-buffer-len``),
group advantages (reward minus the group's mean, divided by its std unless
``--disable-grpo-std-normalization``), then, with ``--normalize-advantages``, whitening over the
rollout's response tokens (a truncated response weighs nothing under ``--overlong-filter``).
GSPO keeps GRPO's advantages and takes one ratio per response.

A new variant is a class here, registered in `ESTIMATORS` (which the flag's choices list), with
its test in ``tests/trainer/grpo/test_advantages.py``. Pure: tensors in, tensors out; no Ray, no
backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from trainer.grpo.loss import group_advantages, overlong_penalty, whiten

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft penalty: 0 up to ``max_len - buffer_len`` tokens, then down to ``-factor``."""

    max_len: int
    buffer_len: int
    factor: float


@dataclass(frozen=True)
class GRPOEstimator:
    """GRPO: group advantages, optionally shaped (overlong penalty) and whitened."""

    group_size: int
    std_normalization: bool = True
    whiten: bool = False
    drop_truncated: bool = False  # --overlong-filter: truncated responses count in no loss
    overlong: OverlongPenalty | None = None

    sequence_ratio: ClassVar[bool] = False
    ratio_meaning: ClassVar[str] = "per token"

    def __call__(
        self, rewards: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages ``[B]`` of rewards ``[B]``, response lengths ``[B]`` and truncation
        ``[B]`` (bool), with the metrics of the shaping."""
        metrics: dict[str, float] = {}
        if self.overlong is not None:
            penalty = overlong_penalty(
                lengths, self.overlong.max_len, self.overlong.buffer_len, self.overlong.factor
            )
            rewards = rewards + penalty
            metrics["rollout/overlong_penalty_mean"] = float(penalty.mean())
        advantages = group_advantages(rewards, self.group_size, self.std_normalization)
        if self.whiten:
            # a sample weighs by its loss tokens: none for a truncated one under the filter
            weights = lengths.masked_fill(truncated & self.drop_truncated, 0)
            if weights.sum() > 0:
                advantages = whiten(advantages, weights)
        return advantages, metrics

    def meaning(self) -> str:
        """The advantage in words (``--validate-only`` prints it)."""
        meaning = "reward - group mean"
        if self.std_normalization:
            meaning += ", divided by the group std"
        if self.whiten:
            meaning += ", then whitened over all response tokens of the rollout"
        return meaning


@dataclass(frozen=True)
class GSPOEstimator(GRPOEstimator):
    """GSPO: GRPO's advantages; the loss takes one ratio per response, ``exp(mean over its
    tokens of logp - old)``."""

    sequence_ratio: ClassVar[bool] = True
    ratio_meaning: ClassVar[str] = "one per response (GSPO)"


ESTIMATORS: dict[str, type[GRPOEstimator]] = {"grpo": GRPOEstimator, "gspo": GSPOEstimator}
