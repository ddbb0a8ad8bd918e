"""Rollouts: how many, how many prompts and samples each, and how responses are sampled."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainer.config.data import function_path_problems
from trainer.config.flags import flag, fraction, non_negative, positive

MILES_NONZERO_STD_FILTER = (
    "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
)
NONZERO_STD_FILTER = "trainer.grpo.filters.check_reward_nonzero_std"


@dataclass(frozen=True)
class RolloutConfig:
    TITLE = "rollout"

    num_rollout: int | None = flag(
        None,
        help="rollouts to run, each: generate, grade, then one or more optimizer steps "
        "(--num-steps-per-rollout); unset: as many as --num-epoch takes",
    )
    num_epoch: int | None = flag(None, help="epochs to train when --num-rollout is unset")
    rollout_batch_size: int = flag(4, help="prompts per rollout")
    n_samples_per_prompt: int = flag(4, help="GRPO group size")
    rollout_max_response_len: int = flag(
        256,
        help="most tokens generated per response (max_new_tokens); a response cut there is "
        "truncated (see --overlong-filter); also the constant of --loss-agg "
        "seq-mean-token-sum-norm (miles: unset)",
    )
    rollout_temperature: float = flag(
        1.0,
        help="sampling temperature of the rollouts; the trainer's log-probs are "
        "log_softmax(logits / T) with the same T, so the PPO ratio compares like with like; "
        "0: greedy (log-probs at T = 1)",
    )
    rollout_top_p: float = flag(
        1.0,
        help="nucleus sampling: draw from the most likely tokens whose probability adds up to p; "
        "1 disables it",
    )
    rollout_top_k: int = flag(-1, help="-1 disables top-k")
    rollout_stop: tuple[str, ...] | None = flag(
        None,
        nargs="+",
        metavar="TEXT",
        help="stop strings: a response ends with the first one it produces",
    )
    rollout_stop_token_ids: tuple[int, ...] | None = flag(
        None, nargs="+", metavar="ID", help="token ids that end a response, besides EOS"
    )
    rollout_request_seeds: bool = flag(
        True,
        negated="--no-rollout-request-seeds",
        help="leave the engines to sample from their own random state instead of from one "
        "seed per request (reruns and resumed runs then sample differently; SGLang samples "
        "faster without seeds)",
    )
    over_sampling_batch_size: int | None = flag(
        None,
        help="prompts per generation round with dynamic sampling (default --rollout-batch-size)",
    )
    dynamic_sampling_filter_path: str | None = flag(
        None,
        help="module.function(args, group) -> keep?; miles' check_reward_nonzero_std path works",
    )

    @property
    def samples(self) -> int:
        """Samples per rollout: prompts x samples per prompt."""
        return self.rollout_batch_size * self.n_samples_per_prompt

    def resolved(self) -> RolloutConfig:
        path = self.dynamic_sampling_filter_path
        return replace(
            self,
            num_epoch=1 if self.num_rollout is None and self.num_epoch is None else self.num_epoch,
            over_sampling_batch_size=self.rollout_batch_size
            if self.over_sampling_batch_size is None
            else self.over_sampling_batch_size,
            dynamic_sampling_filter_path=NONZERO_STD_FILTER
            if path == MILES_NONZERO_STD_FILTER
            else path,
        )

    def problems(self) -> Iterator[str]:
        yield from positive(
            self, "num_epoch", "num_rollout", "rollout_batch_size", "n_samples_per_prompt",
            "rollout_max_response_len", "over_sampling_batch_size",
        )  # fmt: skip
        yield from non_negative(self, "rollout_temperature")
        yield from fraction(self, "rollout_top_p", closed_at_one=True)
        if self.rollout_top_k == 0 or self.rollout_top_k < -1:
            yield f"--rollout-top-k must be -1 (off) or > 0 (got {self.rollout_top_k})"
        if self.dynamic_sampling_filter_path and self.n_samples_per_prompt < 2:
            yield (
                "--dynamic-sampling-filter-path judges groups of samples: it needs "
                f"--n-samples-per-prompt >= 2 (got {self.n_samples_per_prompt})"
            )
        yield from function_path_problems(self, "dynamic_sampling_filter_path")
        if self.over_sampling_batch_size < self.rollout_batch_size:
            yield (
                f"--over-sampling-batch-size {self.over_sampling_batch_size} must be >= "
                f"--rollout-batch-size {self.rollout_batch_size}"
            )
