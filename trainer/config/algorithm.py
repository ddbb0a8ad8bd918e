"""The GRPO algorithm: advantage estimator, policy loss, KL, entropy, importance weights."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainer.config.flags import flag, non_negative, positive
from trainer.config.rollout import RolloutConfig
from trainer.grpo.advantages import ESTIMATORS, GRPOEstimator, OverlongPenalty
from trainer.grpo.loss import AGG_MODES, KL_TYPES, GRPOConfig


@dataclass(frozen=True)
class AlgorithmConfig:
    TITLE = "GRPO"

    advantage_estimator: str = flag(
        "grpo",
        choices=tuple(ESTIMATORS),
        help="gspo: GRPO advantages with one (sequence-level) ratio per response",
    )
    ref_load: str | None = flag(
        None,
        help="reference checkpoint; with LoRA the reference is --hf-checkpoint without the adapter",
    )
    kl_coef: float = flag(
        0.0,
        help="reward-shaping KL (miles: ppo/reinforce++ only; no effect with grpo, so must be 0)",
    )
    grpo_std_normalization: bool = flag(
        True,
        negated="--disable-grpo-std-normalization",
        help="only centre rewards on the group mean (Dr.GRPO); by default also divide by the std",
    )
    normalize_advantages: bool = flag(
        False,
        help="whiten the advantages over all response tokens of the rollout (every DP rank)",
    )
    use_kl_loss: bool = flag(
        False,
        help="KL to the reference policy (the adapter switched off) in the loss, times "
        "--kl-loss-coef; runs a reference forward each rollout and logs train/kl",
    )
    kl_loss_coef: float = flag(
        0.0, help="weight of the KL term in the loss (with --use-kl-loss); 0 only logs the KL"
    )
    kl_loss_type: str = flag(
        "k1",
        choices=KL_TYPES,
        help="per-token KL estimator, from log r = logp - ref of the sampled tokens: k1 log r, "
        "k2 (log r)^2 / 2, k3 exp(-log r) + log r - 1, low_var_kl k3 clamped (as miles, verl)",
    )
    entropy_coef: float = flag(
        0.0,
        help="entropy bonus: the loss subtracts this times the policy's entropy over the "
        "response tokens (aggregated as --loss-agg); train/entropy is logged either way",
    )
    eps_clip: float = flag(
        0.2,
        help="lower PPO clip range: the ratio is clipped below at 1 - eps (and above at 1 + eps "
        "unless --eps-clip-high)",
    )
    eps_clip_high: float | None = flag(None, help="upper clip; defaults to --eps-clip")
    eps_clip_c: float | None = flag(
        None, help="dual-clip PPO: cap a negative advantage's loss (> 1)"
    )
    use_tis: bool = flag(
        False, help="truncated importance sampling against the rollout engine's log-probs"
    )
    tis_clip: float = flag(2.0, help="upper bound of the TIS weight")
    tis_clip_low: float = flag(0.0, help="lower bound of the TIS weight")
    calculate_per_token_loss: bool = flag(
        False, help="token mean over the step (miles); default: per-sample mean (--loss-agg)"
    )
    loss_agg: str | None = flag(
        None,
        choices=AGG_MODES,
        help="this project's finer choice; default seq-mean-token-mean, or token-mean with "
        "--calculate-per-token-loss",
    )
    overlong_filter: bool = flag(
        False, help="DAPO: truncated responses (no EOS within the length limit) count in no loss"
    )
    overlong_buffer_len: int | None = flag(
        None,
        help="DAPO soft overlong penalty: tokens before --rollout-max-response-len where it starts",
    )
    overlong_penalty_factor: float = flag(
        1.0, help="the reward penalty at --rollout-max-response-len (with --overlong-buffer-len)"
    )

    def resolved(self, group_size: int) -> AlgorithmConfig:
        default_agg = "token-mean" if self.calculate_per_token_loss else "seq-mean-token-mean"
        return replace(
            self,
            eps_clip_high=self.eps_clip if self.eps_clip_high is None else self.eps_clip_high,
            loss_agg=self.loss_agg or default_agg,
            # as miles: a group of one has no spread
            grpo_std_normalization=self.grpo_std_normalization and group_size != 1,
        )

    def estimator(self, rollout: RolloutConfig) -> GRPOEstimator:
        """The advantage estimator ``--advantage-estimator`` names, with these settings."""
        overlong = None
        if self.overlong_buffer_len:
            overlong = OverlongPenalty(
                rollout.rollout_max_response_len,
                self.overlong_buffer_len,
                self.overlong_penalty_factor,
            )
        return ESTIMATORS[self.advantage_estimator](
            group_size=rollout.n_samples_per_prompt,
            std_normalization=self.grpo_std_normalization,
            whiten=self.normalize_advantages,
            drop_truncated=self.overlong_filter,
            overlong=overlong,
        )

    def loss(self, rollout: RolloutConfig) -> GRPOConfig:
        """The policy loss's settings (`trainer.grpo.loss.grpo_loss`)."""
        return GRPOConfig(
            eps_clip=self.eps_clip,
            eps_clip_high=self.eps_clip_high,
            loss_agg=self.loss_agg,
            use_kl_loss=self.use_kl_loss,
            kl_loss_coef=self.kl_loss_coef,
            kl_loss_type=self.kl_loss_type,
            entropy_coef=self.entropy_coef,
            eps_clip_c=self.eps_clip_c,
            sequence_ratio=ESTIMATORS[self.advantage_estimator].sequence_ratio,
            use_tis=self.use_tis,
            tis_clip=self.tis_clip,
            tis_clip_low=self.tis_clip_low,
            norm_length=float(rollout.rollout_max_response_len),
        )

    def meanings(self, rollout: RolloutConfig) -> dict[str, str]:
        """What the GRPO flags resolve to, in words (``--validate-only`` prints it)."""
        kl = f"{self.kl_loss_type} estimator, "
        if not self.use_kl_loss:
            kl += "off (no reference forward)"
        else:
            kl += f"in the loss x {self.kl_loss_coef}" if self.kl_loss_coef else "logged only"
        estimator = self.estimator(rollout)
        policy = (
            f"PPO ratio {estimator.ratio_meaning} clipped to "
            f"[{1 - self.eps_clip:g}, {1 + self.eps_clip_high:g}]"
        )
        if self.eps_clip_c is not None:
            policy += f", dual clip {self.eps_clip_c:g}"
        if self.use_tis:
            policy += f", TIS weights in [{self.tis_clip_low:g}, {self.tis_clip:g}]"
        return {
            "advantage": estimator.meaning(),
            "loss_aggregation": self.loss_agg,
            "kl": kl,
            "policy_loss": policy,
        }

    def problems(self) -> Iterator[str]:
        yield from non_negative(self, "eps_clip", "eps_clip_high", "kl_loss_coef", "entropy_coef")
        yield from positive(self, "tis_clip")
        yield from non_negative(self, "tis_clip_low", "overlong_penalty_factor")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            yield f"--eps-clip-c must be > 1 (got {self.eps_clip_c})"
        if self.use_tis and self.tis_clip_low > self.tis_clip:
            yield (
                f"--tis-clip-low ({self.tis_clip_low}) must not exceed --tis-clip ({self.tis_clip})"
            )
        if self.kl_coef != 0:
            yield (
                "--kl-coef shapes rewards only for ppo/reinforce++ in miles and has no effect "
                f"with --advantage-estimator {self.advantage_estimator}: use --use-kl-loss "
                "--kl-loss-coef"
            )
        if self.calculate_per_token_loss and self.loss_agg != "token-mean":
            yield (
                f"--calculate-per-token-loss is token-mean; --loss-agg {self.loss_agg} "
                "contradicts it"
            )
