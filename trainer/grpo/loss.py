"""GRPO in plain PyTorch: group advantages, the clipped policy loss, KL estimators, entropy.

Per-token tensors are ``[batch, tokens]`` with a 0/1 `mask` marking the response tokens that
count. Losses are aggregated by `aggregate`; to accumulate gradients over micro-batches with the
normalisation of the whole optimizer step, count the step once with `Normalizer.from_masks` and
pass it to every micro-batch: each micro-batch's loss (and metric) is then its share, and the
shares sum to the step's value.

The vocabulary (`AGG_MODES`, `KL_TYPES`) is what ``train.py``'s flags offer. The math takes
tensors and calls their methods: torch itself is imported for type checking only, so the command
line reads the vocabulary on a base install (no torch), as launchers' recordings do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


def group_advantages(
    rewards: torch.Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantages ``(r - mean_group) / (std_group + eps)`` for rewards ``[B]``.

    The `group_size` samples of one prompt are contiguous. `std` is the unbiased sample standard
    deviation (as in verl and TRL); a group whose rewards are all equal gets advantage 0.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards {tuple(rewards.shape)} do not split into groups of {group_size}")
    groups = rewards.float().view(-1, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        centred = centred / (groups.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)


def whiten(values: torch.Tensor, weights: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(v - mean) / sqrt(var + eps)`` with the mean and the unbiased variance weighted by
    `weights` (miles' ``--normalize-advantages``: a sample's advantage counts once per response
    token, over every sample of the rollout, i.e. every data-parallel rank)."""
    values, weights = values.float(), weights.float()
    count = weights.sum()
    if count <= 0:
        raise ValueError("whitening needs at least one response token")
    mean = (values * weights).sum() / count
    variance = (values.square() * weights).sum() / count - mean.square()
    if count >= 2:
        variance = variance * count / (count - 1)
    return (values - mean) * (variance + eps).rsqrt()


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float
) -> torch.Tensor:
    """DAPO's soft overlong punishment, added to the reward: 0 up to ``max_len - buffer_len``
    tokens, then falling linearly to ``-factor`` at `max_len`."""
    excess = lengths.float() - (max_len - buffer_len)
    return -factor * (excess / buffer_len).clamp(0.0, 1.0)


@dataclass(frozen=True)
class Normalizer:
    """Denominators of one optimizer step: response tokens, and sequences with any token.

    Under data parallelism with gradient averaging (DDP), all-reduce-sum the counts over the
    ranks and divide them by the rank count, so the averaged gradient is the global one.
    """

    tokens: float
    sequences: float

    @classmethod
    def from_masks(cls, masks: Iterable[torch.Tensor]) -> Normalizer:
        tokens = sequences = 0.0
        for mask in masks:
            per_sequence = mask.sum(dim=-1)
            tokens += float(per_sequence.sum())
            sequences += float((per_sequence > 0).sum())
        return cls(tokens, sequences)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    normalizer: Normalizer | None = None,
    norm_length: float = 1.0,
) -> torch.Tensor:
    """Reduce per-token `values` to a scalar.

    token-mean: sum over all tokens / token count. seq-mean-token-mean: mean over each
    sequence's tokens, then mean over sequences. seq-mean-token-sum: sum over each sequence's
    tokens, then mean over sequences. seq-mean-token-sum-norm (Dr.GRPO): each sequence's token
    sum divided by the constant `norm_length` (the response budget), then mean over sequences.
    Sequences without tokens do not count.
    """
    mask = mask.to(values.dtype)
    normalizer = normalizer or Normalizer.from_masks([mask])
    masked = values * mask
    if mode == "token-mean":
        return masked.sum() / _nonzero(normalizer.tokens)
    if mode == "seq-mean-token-mean":
        per_sequence = masked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    elif mode == "seq-mean-token-sum":
        per_sequence = masked.sum(dim=-1)
    elif mode == "seq-mean-token-sum-norm":
        per_sequence = masked.sum(dim=-1) / norm_length
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGG_MODES}")
    return per_sequence.sum() / _nonzero(normalizer.sequences)


def _nonzero(count: float) -> float:
    return count if count > 0 else 1.0


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    agg: str = "token-mean",
    normalizer: Normalizer | None = None,
    *,
    eps_clip_c: float | None = None,
    sequence_ratio: bool = False,
    weights: torch.Tensor | None = None,
    norm_length: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with the ratio clipped to ``[1 - eps_clip, 1 + eps_clip_high]``.

    `advantages` is per sequence ``[B]`` or per token ``[B, T]``. With `eps_clip_c` (dual clip),
    a negative advantage's loss is capped at ``-eps_clip_c * A``. With `sequence_ratio` (GSPO),
    every token of a sequence takes the ratio ``exp(mean over its tokens of logp - old)``.
    `weights` (per token, e.g. truncated importance weights) multiply the per-token loss.
    Returns (loss, clip fraction): the fraction of tokens where the clipped term counts.
    """
    eps_clip_high = eps_clip if eps_clip_high is None else eps_clip_high
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    log_ratio = logprobs - old_logprobs
    if sequence_ratio:
        tokens = mask.to(log_ratio.dtype)
        per_sequence = (log_ratio * tokens).sum(-1, keepdim=True) / tokens.sum(-1, keepdim=True)
        log_ratio = per_sequence.nan_to_num(0.0).expand_as(log_ratio)
    ratio = log_ratio.clamp(-20.0, 20.0).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    losses = unclipped.maximum(clipped)
    if eps_clip_c is not None:
        losses = losses.minimum(-eps_clip_c * advantages).where(advantages < 0, losses)
    if weights is not None:
        losses = losses * weights
    loss = aggregate(losses, mask, agg, normalizer, norm_length)
    clip_fraction = aggregate(
        (clipped > unclipped).to(logprobs.dtype), mask, "token-mean", normalizer
    )
    return loss, clip_fraction.detach()


def truncated_importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """TIS: ``clamp(exp(old - rollout), low, high)`` per token, the correction for sampling with
    the rollout engine's numerics; returns (weights, the raw ratios)."""
    ratio = (old_logprobs - rollout_logprobs).clamp(-20.0, 20.0).exp()
    return ratio.clamp(low, high), ratio


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl"
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probabilities.

    k1: ``log r``; k2: ``0.5 (log r)^2``; k3: ``exp(-log r) + log r - 1`` (Schulman's unbiased,
    non-negative estimator); low_var_kl: k3 with ``log r`` clamped to [-20, 20] and the result to
    [-10, 10] (as miles and verl); ``log r = logp - ref``.
    """
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return (-log_ratio).exp() + log_ratio - 1.0
    if kind == "low_var_kl":
        ref_minus_logp = (-log_ratio).clamp(-20.0, 20.0)
        return (ref_minus_logp.exp() - ref_minus_logp - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {KL_TYPES}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax over the last dimension: ``logsumexp(z) - sum softmax(z) z``."""
    probs = logits.softmax(dim=-1)
    return logits.logsumexp(dim=-1) - (probs * logits).sum(dim=-1)


@dataclass(frozen=True)
class GRPOConfig:
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    loss_agg: str = "seq-mean-token-mean"
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    entropy_coef: float = 0.0
    eps_clip_c: float | None = None
    sequence_ratio: bool = False  # GSPO
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    norm_length: float = 1.0  # seq-mean-token-sum-norm's constant


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: GRPOConfig | None = None,
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    normalizer: Normalizer | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``pg_loss + kl_loss_coef * kl (with use_kl_loss) - entropy_coef * entropy``.

    `old_logprobs` None: on-policy, the one optimizer step of a rollout, whose old policy is
    the current one; its log-probabilities are `logprobs` themselves (without gradient).

    Metrics: ``pg_loss``, ``pg_clipfrac``, ``ppo_ratio`` (token mean), plus ``kl`` when
    `ref_logprobs` is given, ``entropy`` when `entropy` (per token) is given,
    ``train_rollout_logprob_abs_diff`` (token mean of |old - rollout|) when the rollout engine's
    `rollout_logprobs` are given, and ``tis`` / ``tis_clipfrac`` with `use_tis` (which needs
    them); with a `normalizer` each is this micro-batch's share of the step's value.
    """
    config = config or GRPOConfig()
    if old_logprobs is None:
        old_logprobs = logprobs.detach()
    _check_terms(config, ref_logprobs, entropy, rollout_logprobs)
    normalizer = normalizer or Normalizer.from_masks([mask])
    weights, metrics = _rollout_terms(config, old_logprobs, rollout_logprobs, mask, normalizer)
    pg_loss, clip_fraction = policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        config.eps_clip,
        config.eps_clip_high,
        config.loss_agg,
        normalizer,
        eps_clip_c=config.eps_clip_c,
        sequence_ratio=config.sequence_ratio,
        weights=weights,
        norm_length=config.norm_length,
    )
    ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0).exp().detach()
    metrics.update(
        pg_loss=pg_loss.detach(),
        pg_clipfrac=clip_fraction.detach(),
        ppo_ratio=aggregate(ratio, mask, "token-mean", normalizer),
    )
    loss = _regularized(pg_loss, config, logprobs, ref_logprobs, entropy, mask, normalizer, metrics)
    return loss, metrics


def _regularized(
    loss: torch.Tensor,
    config: GRPOConfig,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    mask: torch.Tensor,
    normalizer: Normalizer,
    metrics: dict[str, torch.Tensor],
) -> torch.Tensor:
    """`loss` ``+ kl_loss_coef * kl`` (with use_kl_loss) ``- entropy_coef * entropy``;
    `metrics` gains ``kl`` and ``entropy`` wherever they can be computed."""
    if ref_logprobs is not None:
        kl = aggregate(
            kl_penalty(logprobs, ref_logprobs, config.kl_loss_type),
            mask,
            config.loss_agg,
            normalizer,
            config.norm_length,
        )
        metrics["kl"] = kl.detach()
        if config.use_kl_loss:
            loss = loss + config.kl_loss_coef * kl
    if entropy is not None:
        entropy_value = aggregate(entropy, mask, config.loss_agg, normalizer, config.norm_length)
        metrics["entropy"] = entropy_value.detach()
        if config.entropy_coef:
            loss = loss - config.entropy_coef * entropy_value
    return loss


def _check_terms(
    config: GRPOConfig,
    ref_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    rollout_logprobs: torch.Tensor | None,
) -> None:
    """Each term the config asks for has what it is computed from."""
    if config.use_kl_loss and ref_logprobs is None:
        raise ValueError("use_kl_loss needs ref_logprobs")
    if config.entropy_coef and entropy is None:
        raise ValueError("entropy_coef needs the per-token entropy")
    if config.use_tis and rollout_logprobs is None:
        raise ValueError("use_tis needs rollout_logprobs")


def _rollout_terms(
    config: GRPOConfig,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    normalizer: Normalizer,
) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
    """What the rollout engine's log-probs give `grpo_loss`: the TIS weights (with `use_tis`)
    and the metrics of the mismatch between the engine and the trainer."""
    if rollout_logprobs is None:
        return None, {}
    mismatch = (old_logprobs - rollout_logprobs).abs()
    metrics = {
        "train_rollout_logprob_abs_diff": aggregate(mismatch, mask, "token-mean", normalizer)
    }
    if not config.use_tis:
        return None, metrics
    weights, tis = truncated_importance_weights(
        old_logprobs, rollout_logprobs, config.tis_clip_low, config.tis_clip
    )
    metrics["tis"] = aggregate(tis, mask, "token-mean", normalizer)
    clipped = (weights != tis).to(tis.dtype)
    metrics["tis_clipfrac"] = aggregate(clipped, mask, "token-mean", normalizer)
    return weights, metrics
