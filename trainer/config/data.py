"""The prompt data set, and how responses are graded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainer.config.flags import flag, json_object, option, positive
from trainer.grpo.rewards import reward_names

_FUNCTION_PATH = re.compile(r"[\w.]+\.\w+")


def function_path_problems(group: object, *names: str) -> Iterator[str]:
    """``module.function`` flags (a user function, imported when the run starts)."""
    for name in names:
        value = getattr(group, name)
        if value is not None and not _FUNCTION_PATH.fullmatch(value):
            yield f"{option(name)} must be module.function (got {value})"


@dataclass(frozen=True)
class DataConfig:
    TITLE = "data"

    prompt_data: str = flag(help="JSONL or Parquet prompt set")
    input_key: str = flag(
        "prompt",
        help="row key of the prompt: a string, or a list of chat messages (these need "
        "--apply-chat-template) (miles: input)",
    )
    label_key: str = flag(
        "label",
        help="row key of the label the reward grades against; every row needs it, and the "
        "row's other keys become the sample's metadata (miles: unset)",
    )
    apply_chat_template: bool = flag(
        False,
        help="render each prompt with the tokenizer's chat template and its generation prompt "
        "(a string becomes one user message); without it a string prompt is used as is",
    )
    apply_chat_template_kwargs: dict[str, Any] = flag(
        factory=dict,
        parse=json_object,
        help="JSON object for the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    rollout_shuffle: bool = flag(
        False,
        help="visit the prompts in a random order, reshuffled every epoch from --seed (a resumed "
        "run continues the same order); else in file order",
    )
    rollout_max_prompt_len: int | None = flag(None, help="drop longer prompts (tokens)")

    def problems(self) -> Iterator[str]:
        yield from positive(self, "rollout_max_prompt_len")


@dataclass(frozen=True)
class RewardConfig:
    TITLE = "reward"

    rm_type: str = flag(
        "math",
        choices=reward_names,
        help="rule-based reward of a response against its label: deepscaler and math grade as "
        "miles' rm_hub; exact_match and prefix_match: the text after any </think> equals or "
        "starts with the label; tiny: the CPU recipe's task; unused with --custom-rm-path "
        "(miles: unset)",
    )
    custom_rm_path: str | None = flag(
        None,
        help="module.function called as fn(args, sample) -> reward (may be async), as in miles",
    )
    reward_key: str | None = flag(None, help="the key of the reward in a reward function's dict")

    def problems(self) -> Iterator[str]:
        yield from function_path_problems(self, "custom_rm_path")
