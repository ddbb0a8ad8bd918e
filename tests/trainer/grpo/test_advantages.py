"""Advantage estimators (``--advantage-estimator``): pure functions of a rollout's rewards."""

from __future__ import annotations

import pytest
import torch

from trainer.arguments import build_parser, parse_args
from trainer.grpo.advantages import ESTIMATORS, GRPOEstimator, GSPOEstimator, OverlongPenalty
from trainer.grpo.loss import group_advantages, whiten

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # two groups of three
LENGTHS = torch.tensor([4, 10, 6, 2, 8, 10])
TRUNCATED = torch.tensor([False, True, False, False, False, True])


def test_grpo_defaults_are_group_advantages() -> None:
    advantages, metrics = GRPOEstimator(group_size=3)(REWARDS, LENGTHS, TRUNCATED)
    torch.testing.assert_close(advantages, group_advantages(REWARDS, 3))
    assert metrics == {}
    centred, _ = GRPOEstimator(group_size=3, std_normalization=False)(REWARDS, LENGTHS, TRUNCATED)
    torch.testing.assert_close(centred, torch.tensor([2, -1, -1, 0, 0, 0]) / 3.0)


def test_the_overlong_penalty_shapes_the_rewards_before_the_groups() -> None:
    # max 10, buffer 4: 0 up to 6 tokens, then down to -0.5 at 10
    overlong = OverlongPenalty(max_len=10, buffer_len=4, factor=0.5)
    advantages, metrics = GRPOEstimator(group_size=3, overlong=overlong)(
        REWARDS, LENGTHS, TRUNCATED
    )
    penalty = torch.tensor([0.0, -0.5, 0.0, 0.0, -0.25, -0.5])
    torch.testing.assert_close(advantages, group_advantages(REWARDS + penalty, 3))
    assert metrics == {"rollout/overlong_penalty_mean": pytest.approx(float(penalty.mean()))}


@pytest.mark.parametrize("drop_truncated", [False, True])
def test_whitening_weighs_each_sample_by_its_loss_tokens(drop_truncated: bool) -> None:
    estimator = GRPOEstimator(group_size=3, whiten=True, drop_truncated=drop_truncated)
    advantages, _ = estimator(REWARDS, LENGTHS, TRUNCATED)
    weights = LENGTHS.masked_fill(TRUNCATED, 0) if drop_truncated else LENGTHS
    torch.testing.assert_close(advantages, whiten(group_advantages(REWARDS, 3), weights))


def test_whitening_without_loss_tokens_leaves_the_advantages() -> None:
    estimator = GRPOEstimator(group_size=2, whiten=True, drop_truncated=True)
    rewards, truncated = torch.tensor([1.0, 0.0]), torch.tensor([True, True])
    advantages, _ = estimator(rewards, torch.tensor([3, 5]), truncated)
    torch.testing.assert_close(advantages, group_advantages(rewards, 2))


def test_gspo_keeps_grpo_advantages_and_takes_one_ratio_per_response() -> None:
    grpo, _ = GRPOEstimator(group_size=3, whiten=True)(REWARDS, LENGTHS, TRUNCATED)
    gspo, _ = GSPOEstimator(group_size=3, whiten=True)(REWARDS, LENGTHS, TRUNCATED)
    torch.testing.assert_close(gspo, grpo)
    assert (GRPOEstimator.sequence_ratio, GSPOEstimator.sequence_ratio) == (False, True)


def test_meaning_says_the_pipeline_in_words() -> None:
    assert GRPOEstimator(group_size=4).meaning() == "reward - group mean, divided by the group std"
    assert GRPOEstimator(group_size=4, std_normalization=False, whiten=True).meaning() == (
        "reward - group mean, then whitened over all response tokens of the rollout"
    )


def test_the_flag_offers_every_estimator_and_builds_it_from_the_flags() -> None:
    [action] = [a for a in build_parser()._actions if a.dest == "advantage_estimator"]
    assert tuple(action.choices) == tuple(ESTIMATORS) == ("grpo", "gspo")
    config = parse_args(
        ["--hf-checkpoint", "m", "--prompt-data", "d", "--advantage-estimator", "gspo",
         "--normalize-advantages", "--overlong-filter", "--overlong-buffer-len", "64",
         "--overlong-penalty-factor", "0.5", "--n-samples-per-prompt", "8"]
    )  # fmt: skip
    assert config.algorithm.estimator(config.rollout) == GSPOEstimator(
        group_size=8,
        std_normalization=True,
        whiten=True,
        drop_truncated=True,
        overlong=OverlongPenalty(max_len=256, buffer_len=64, factor=0.5),
    )
