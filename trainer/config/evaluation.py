"""Evaluation: the named eval sets, how often, and how their responses are sampled."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainer.config.flags import collected, flag, fraction, non_negative, positive
from trainer.config.rollout import RolloutConfig


@dataclass(frozen=True)
class EvalConfig:
    TITLE = "eval"

    eval_interval: int | None = flag(
        None,
        help="evaluate every N rollouts; the last rollout is always evaluated, so without this "
        "flag only it is (unlike miles, no eval before training); needs --eval-prompt-data",
    )
    eval_prompt_data: tuple[str, ...] | None = flag(
        None,
        nargs="+",
        metavar="NAME PATH",
        help="eval sets as NAME PATH pairs, read like --prompt-data (same keys, chat template "
        "and --rollout-max-prompt-len); logged as eval/NAME, the mean reward",
    )
    n_samples_per_eval_prompt: int = flag(
        1, help="responses per eval prompt; eval/NAME averages the reward over all of them"
    )
    eval_max_response_len: int | None = flag(
        None, help="most tokens generated per eval response; default: --rollout-max-response-len"
    )
    eval_temperature: float | None = flag(
        None, help="sampling temperature of the evals; default: --rollout-temperature"
    )
    eval_top_p: float | None = flag(
        None,
        help="top-p of the evals; default: --rollout-top-p (evals take --rollout-top-k and the "
        "stop settings from the rollout)",
    )
    eval_datasets: dict[str, str] = collected(dict)  # --eval-prompt-data's pairs, by name

    def resolved(self, rollout: RolloutConfig) -> EvalConfig:
        """Unset sampling settings take the rollout's."""
        pairs = self.eval_prompt_data or ()
        return replace(
            self,
            eval_max_response_len=rollout.rollout_max_response_len
            if self.eval_max_response_len is None
            else self.eval_max_response_len,
            eval_temperature=rollout.rollout_temperature
            if self.eval_temperature is None
            else self.eval_temperature,
            eval_top_p=rollout.rollout_top_p if self.eval_top_p is None else self.eval_top_p,
            eval_datasets=dict(zip(pairs[::2], pairs[1::2], strict=False)),
        )

    def problems(self) -> Iterator[str]:
        yield from positive(
            self, "eval_interval", "n_samples_per_eval_prompt", "eval_max_response_len"
        )
        yield from non_negative(self, "eval_temperature")
        yield from fraction(self, "eval_top_p", closed_at_one=True)
        if self.eval_prompt_data is not None:
            pairs = self.eval_prompt_data
            if len(pairs) % 2:
                yield (
                    f"--eval-prompt-data takes NAME PATH pairs (got {len(pairs)} values: "
                    f"{' '.join(pairs)})"
                )
            elif len(self.eval_datasets) != len(pairs) // 2:
                yield "--eval-prompt-data names must be unique"
        if self.eval_interval is not None and not self.eval_prompt_data:
            yield "--eval-interval needs --eval-prompt-data"
