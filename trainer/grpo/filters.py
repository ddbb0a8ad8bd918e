"""Dynamic-sampling filters (DAPO): which generated groups a rollout keeps.

A filter is ``fn(args, group) -> keep`` with `group` the `RewardSample`s of one prompt (rewards
set); `keep` is a bool or, as miles' filters return, an object with a ``keep`` attribute.
``--dynamic-sampling-filter-path`` names one; miles' own path for `check_reward_nonzero_std`
resolves to the one here.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from trainer.grpo.rewards import RewardSample


def check_reward_nonzero_std(args: argparse.Namespace, group: Sequence[RewardSample]) -> bool:
    """Keep a group whose rewards differ (miles: std > 1e-8): a uniform group's advantages are
    all 0, so it would only dilute the step."""
    rewards = torch.tensor([float(sample.reward) for sample in group], dtype=torch.float64)
    return bool(rewards.std() > 1e-8)


def keeps(output: object) -> bool:
    """A filter's verdict: a bool, or miles' ``DynamicFilterOutput``-like ``.keep``."""
    return bool(getattr(output, "keep", output))
