"""GRPO math against hand-computed values (worked out in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.arguments import parse_args
from trainer.grpo.loss import (
    GRPOConfig,
    Normalizer,
    aggregate,
    entropy_from_logits,
    group_advantages,
    grpo_loss,
    kl_penalty,
    overlong_penalty,
    policy_loss,
    whiten,
)

LN2 = math.log(2.0)


def floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


def close(actual: torch.Tensor | float, expected: list[float] | float) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        atol=1e-5,
        rtol=1e-5,
    )


def test_group_advantages() -> None:
    # group 1: rewards 1,0,0,1 -> mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.577350
    #          -> +-0.5 / 0.577350 = +-0.866025; group 2: all 1 -> std 0 -> advantage 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    close(group_advantages(rewards, 4), [0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0])
    close(group_advantages(rewards, 4, normalize_std=False), [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    # rewards 0,3 -> mean 1.5, std sqrt(2 * 2.25 / 1) = 2.121320 -> -+0.707107
    close(group_advantages(torch.tensor([0.0, 3.0]), 2), [-0.707107, 0.707107])
    close(group_advantages(torch.tensor([0.3, 0.9]), 1), [0.0, 0.0])  # a lone sample: 0


def test_whiten_weights_each_sample_by_its_tokens() -> None:
    # values [1, -1] over 1 and 3 tokens: tokens [1, -1, -1, -1], mean -0.5,
    # unbiased var (1.5^2 + 3 * 0.5^2) / 3 = 1; whitened [1.5, -0.5]
    close(whiten(torch.tensor([1.0, -1.0]), torch.tensor([1, 3])), [1.5, -0.5])
    with pytest.raises(ValueError, match="at least one response token"):
        whiten(torch.tensor([1.0]), torch.tensor([0]))


def test_group_advantages_rejects_ragged_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)


VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the third sequence has no tokens


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", 2.75),  # ((1 + 2) / 2 + 4 / 1) / 2 sequences
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
    ],
)
def test_aggregate(mode: str, expected: float) -> None:
    close(aggregate(VALUES, MASK, mode), expected)


def test_aggregate_of_nothing_is_zero_and_unknown_mode_fails() -> None:
    close(aggregate(VALUES, torch.zeros_like(MASK)), 0.0)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(VALUES, MASK, "sum")


def test_policy_loss_asymmetric_clip() -> None:
    # eps_clip 0.2, eps_clip_high 0.28 -> ratio clipped to [0.8, 1.28]; token loss =
    # max(-A r, -A clip(r)):
    #   r 1.5, A +1: max(-1.5, -1.28) = -1.28  (clipped term counts)
    #   r 0.5, A +1: max(-0.5, -0.8)  = -0.5
    #   r 0.5, A -1: max(0.5, 0.8)    =  0.8   (clipped term counts)
    #   r 1.1, A -1: max(1.1, 1.1)    =  1.1
    #   r 1.5, A -1: max(1.5, 1.28)   =  1.5
    #   r 3.0, A +5: masked out
    # token-mean = (-1.28 - 0.5 + 0.8 + 1.1 + 1.5) / 5 = 0.324; clip fraction 2 / 5
    ratio = torch.tensor([[1.5, 0.5, 0.5, 1.1, 1.5, 3.0]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    old = torch.full_like(ratio, -2.0)
    loss, clip_fraction = policy_loss(old + ratio.log(), old, advantages, mask, 0.2, 0.28)
    close(loss, 0.324)
    close(clip_fraction, 0.4)
    # symmetric: r 1.5, A +1 -> -1.2; (-1.2 - 0.5 + 0.8 + 1.1 + 1.5) / 5 = 0.34
    loss, _ = policy_loss(old + ratio.log(), old, advantages, mask, 0.2)
    close(loss, 0.34)


def test_policy_loss_gradient_sign_and_mask() -> None:
    # on-policy (ratio 1): d(-A exp(logp - old)) / d logp / 4 tokens = -A / 4 on live tokens;
    # the clipped token (r = 1.5 > 1.28 with A > 0) and the masked token get no gradient
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0 - math.log(1.5), -1.0]])
    advantages = torch.tensor([[1.0, -1.0, 2.0, 1.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, _ = policy_loss(logprobs, old, advantages, mask, 0.2, 0.28)
    loss.backward()
    close(logprobs.grad, [[-0.25, 0.25, -0.5, 0.0, 0.0]])
    # descending this gradient raises log-probabilities of positive-advantage tokens


def test_sequence_advantages_broadcast_over_tokens() -> None:
    logprobs = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    per_sequence, _ = policy_loss(logprobs, logprobs, torch.tensor([1.0, -3.0]), mask)
    per_token, _ = policy_loss(logprobs, logprobs, torch.tensor([[1.0] * 3, [-3.0] * 3]), mask)
    close(per_sequence, per_token)
    close(per_sequence, 1.0)  # (3 * -1 + 3 * 3) / 6


def test_kl_estimators() -> None:
    # log r = logp - ref = [ln 2, -ln 2, 0]
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), -1.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), -1.0]])
    close(kl_penalty(logprobs, ref, "k1"), [[LN2, -LN2, 0.0]])  # 0.693147
    close(kl_penalty(logprobs, ref, "k2"), [[0.240227, 0.240227, 0.0]])  # 0.5 * ln2^2
    # k3 = exp(ref - logp) - (ref - logp) - 1: 0.5 + ln2 - 1 = 0.193147; 2 - ln2 - 1 = 0.306853
    close(kl_penalty(logprobs, ref, "k3"), [[0.193147, 0.306853, 0.0]])
    close(kl_penalty(logprobs, ref, "low_var_kl"), kl_penalty(logprobs, ref, "k3"))
    # far apart: low_var_kl clamps exp(20) - 20 - 1 to 10; k3 (as miles) does not clamp:
    # exp(3) - 3 - 1 = 16.085537
    close(kl_penalty(torch.tensor([-40.0]), torch.tensor([0.0]), "low_var_kl"), [10.0])
    close(kl_penalty(torch.tensor([-3.0]), torch.tensor([0.0]), "k3"), [16.085537])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logprobs, ref, "k4")


def test_entropy_from_logits() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]])
    # uniform over 4: ln 4 = 1.386294; p = (1/4, 3/4): 0.25 ln 4 + 0.75 ln(4/3) = 0.562335
    close(entropy_from_logits(logits), [1.386294, 0.562335])


def test_grpo_loss_combines_terms() -> None:
    # on-policy, A = +1 on 2 tokens: pg_loss = -1; k3 per token [0.193147, 0.306853] -> 0.25;
    # entropy [1, 2] -> 1.5; loss = -1 + 0.1 * 0.25 - 0.01 * 1.5 = -0.99
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    entropy = torch.tensor([[1.0, 2.0]])
    mask = torch.ones(1, 2)
    config = GRPOConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3", entropy_coef=0.01)
    loss, metrics = grpo_loss(
        logprobs, logprobs, torch.tensor([1.0]), mask, config, ref_logprobs=ref, entropy=entropy
    )
    close(loss, -0.99)
    assert all(
        m.dim() == 0 and not m.requires_grad for m in metrics.values()
    )  # read by the trainer
    assert floats(metrics) == pytest.approx(
        {"pg_loss": -1.0, "pg_clipfrac": 0.0, "ppo_ratio": 1.0, "kl": 0.25, "entropy": 1.5}
    )
    # KL is reported without --use-kl-loss but stays out of the loss
    loss, metrics = grpo_loss(logprobs, logprobs, torch.tensor([1.0]), mask, ref_logprobs=ref)
    close(loss, -1.0)
    assert metrics["kl"] == pytest.approx(0.0) and "entropy" not in metrics  # k1: (ln2 - ln2) / 2


def test_grpo_loss_requires_its_inputs() -> None:
    t = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="use_kl_loss needs ref_logprobs"):
        grpo_loss(t, t, torch.zeros(1), t, GRPOConfig(use_kl_loss=True))
    with pytest.raises(ValueError, match="entropy_coef needs"):
        grpo_loss(t, t, torch.zeros(1), t, GRPOConfig(entropy_coef=0.1))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_sum_to_the_global_batch(mode: str) -> None:
    generator = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=generator)
    logprobs = (old + 0.3 * torch.randn(6, 5, generator=generator)).requires_grad_()
    ref = old + 0.1 * torch.randn(6, 5, generator=generator)
    advantages = torch.randn(6, generator=generator)
    mask = (torch.rand(6, 5, generator=generator) > 0.3).float()
    mask[4] = 0  # a sequence without response tokens
    config = GRPOConfig(loss_agg=mode, use_kl_loss=True, kl_loss_coef=0.05)

    whole, whole_metrics = grpo_loss(logprobs, old, advantages, mask, config, ref_logprobs=ref)
    (whole_grad,) = torch.autograd.grad(whole, logprobs)

    parts = [slice(0, 2), slice(2, 6)]
    normalizer = Normalizer.from_masks(mask[p] for p in parts)
    total, summed = torch.zeros(()), dict.fromkeys(whole_metrics, 0.0)
    for p in parts:
        loss, metrics = grpo_loss(
            logprobs[p], old[p], advantages[p], mask[p], config, ref_logprobs=ref[p],
            normalizer=normalizer,
        )  # fmt: skip
        total = total + loss
        summed = {k: summed[k] + float(metrics[k]) for k in summed}
    (micro_grad,) = torch.autograd.grad(total, logprobs)

    close(total, whole.detach())
    close(micro_grad, whole_grad)
    assert summed == pytest.approx(floats(whole_metrics))


def test_the_algorithm_flags_give_the_loss_settings() -> None:
    config = parse_args(
        ["--hf-checkpoint", "m", "--prompt-data", "d.jsonl", "--eps-clip", "0.1", "--use-kl-loss",
         "--kl-loss-coef", "0.01", "--loss-agg", "seq-mean-token-sum"]
    )  # fmt: skip
    gspo = parse_args(
        ["--hf-checkpoint", "m", "--prompt-data", "d", "--advantage-estimator", "gspo"]
    )
    assert gspo.algorithm.loss(gspo.rollout).sequence_ratio is True
    assert config.algorithm.loss(config.rollout) == GRPOConfig(
        eps_clip=0.1,
        eps_clip_high=0.1,
        loss_agg="seq-mean-token-sum",
        use_kl_loss=True,
        kl_loss_coef=0.01,
        norm_length=256.0,
    )


def test_dual_clip_caps_the_loss_of_a_negative_advantage() -> None:
    # log r = 2: ratio e^2 = 7.389056; A = -1: max(7.389056, 1.28) = 7.389056, dual clip c = 3
    # caps it: min(3, 7.389056) = 3; a positive advantage is left alone: max(-7.39, -1.28)
    logprobs, old, mask = torch.tensor([[2.0]]), torch.tensor([[0.0]]), torch.ones(1, 1)
    plain, _ = policy_loss(logprobs, old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    close(plain, 7.389056)
    dual, _ = policy_loss(logprobs, old, torch.tensor([-1.0]), mask, 0.2, 0.28, eps_clip_c=3.0)
    close(dual, 3.0)
    positive, _ = policy_loss(logprobs, old, torch.tensor([1.0]), mask, 0.2, 0.28, eps_clip_c=3.0)
    close(positive, -1.28)


def test_truncated_importance_sampling_weights_the_tokens() -> None:
    # on policy, A = +1 on 2 tokens (per-token loss -1); old - rollout = [ln 3, ln 0.5]:
    # ratios [3, 0.5] -> weights clamp to [0, 2] = [2, 0.5]; token-mean loss -(2 + 0.5) / 2
    logprobs = torch.tensor([[-1.0, -2.0]])
    rollout = logprobs - torch.tensor([[math.log(3.0), math.log(0.5)]])
    mask = torch.ones(1, 2)
    config = GRPOConfig(loss_agg="token-mean", use_tis=True, tis_clip=2.0)
    loss, metrics = grpo_loss(
        logprobs, logprobs, torch.tensor([1.0]), mask, config, rollout_logprobs=rollout
    )
    close(loss, -1.25)
    assert metrics["tis"] == pytest.approx(1.75) and metrics["tis_clipfrac"] == 0.5
    low = GRPOConfig(loss_agg="token-mean", use_tis=True, tis_clip=2.0, tis_clip_low=0.8)
    loss, _ = grpo_loss(
        logprobs, logprobs, torch.tensor([1.0]), mask, low, rollout_logprobs=rollout
    )
    close(loss, -1.4)  # weights [2, 0.8]
    with pytest.raises(ValueError, match="use_tis needs rollout_logprobs"):
        grpo_loss(logprobs, logprobs, torch.tensor([1.0]), mask, config)


def test_dr_grpo_divides_each_sequence_sum_by_the_budget() -> None:
    # sequence sums 1 + 2 = 3 and 3; each / 4, mean over the 2 sequences = 0.75
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    close(aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=4.0), 0.75)


def test_gspo_takes_one_ratio_per_sequence() -> None:
    # log r per token [ln 2, 0]: GSPO ratio exp(ln 2 / 2) = 1.414214 for both tokens, clipped
    # at 1.28 (A = +1): loss -1.28, clip fraction 1; per token: [-1.28, -1] -> -1.14
    logprobs = torch.tensor([[math.log(2.0), 0.0]])
    old, mask, advantage = torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([1.0])
    loss, clip = policy_loss(logprobs, old, advantage, mask, 0.2, 0.28, sequence_ratio=True)
    close(loss, -1.28)
    close(clip, 1.0)
    loss, clip = policy_loss(logprobs, old, advantage, mask, 0.2, 0.28)
    close(loss, -1.14)
    close(clip, 0.5)


def test_soft_overlong_penalty() -> None:
    # limit 10, buffer 4: no penalty up to 6 tokens, then (len - 6) / 4 of the factor 0.5
    lengths = torch.tensor([5, 6, 7, 8, 10])
    close(overlong_penalty(lengths, 10, 4, 0.5), [0.0, 0.0, -0.125, -0.25, -0.5])


@pytest.mark.parametrize("config", [GRPOConfig(), GRPOConfig(use_tis=True, tis_clip=1.5)])
def test_on_policy_old_logprobs_are_the_forwards_own(config):
    """One optimizer step per rollout: no old log-probs given means the trained policy's own,
    with the same loss, gradient and metrics as when they come from a separate forward."""
    torch.manual_seed(0)
    logprobs = torch.randn(3, 6, requires_grad=True)
    rollout = logprobs.detach() + 0.05 * torch.randn(3, 6)
    advantages, mask = torch.tensor([1.0, -0.5, 0.25]), (torch.rand(3, 6) > 0.3).float()
    results = []
    for old in (None, logprobs.detach().clone()):
        loss, metrics = grpo_loss(logprobs, old, advantages, mask, config, rollout_logprobs=rollout)
        (grad,) = torch.autograd.grad(loss, logprobs)
        results.append((loss.detach(), grad, metrics))
    (loss_a, grad_a, metrics_a), (loss_b, grad_b, metrics_b) = results
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    assert floats(metrics_a) == floats(metrics_b)
    expected = float(((logprobs.detach() - rollout).abs() * mask).sum() / mask.sum())
    assert metrics_a["train_rollout_logprob_abs_diff"] == pytest.approx(expected)
