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
    input_key: str = flag("prompt")
    label_key: str = flag("label")
    apply_chat_template: bool = flag(False)
    apply_chat_template_kwargs: dict[str, Any] = flag(
        factory=dict,
        parse=json_object,
        help="JSON object for the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    rollout_shuffle: bool = flag(False)
    rollout_max_prompt_len: int | None = flag(None, help="drop longer prompts (tokens)")

    def problems(self) -> Iterator[str]:
        yield from positive(self, "rollout_max_prompt_len")


@dataclass(frozen=True)
class RewardConfig:
    TITLE = "reward"

    rm_type: str = flag("math", choices=reward_names)
    custom_rm_path: str | None = flag(
        None,
        help="module.function called as fn(args, sample) -> reward (may be async), as in miles",
    )
    reward_key: str | None = flag(None, help="the key of the reward in a reward function's dict")

    def problems(self) -> Iterator[str]:
        yield from function_path_problems(self, "custom_rm_path")
