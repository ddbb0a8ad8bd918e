"""A launcher's train.py flags are held to the typed config: a misspelt flag or a value of the
wrong type fails when the launcher is recorded, naming the flag."""

from __future__ import annotations

import pytest

from harness import train_flags


def test_values_of_the_fields_type_render_as_flags():
    assert train_flags(lora_rank=64, lora_alpha=32, colocate=True, eval_prompt_data=("a", "b")) == [
        "--lora-rank", "64", "--lora-alpha", "32", "--colocate", "--eval-prompt-data", "a", "b",
    ]  # fmt: skip
    assert train_flags(sglang_log_level="warning") == ["--sglang-log-level", "warning"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lora_rnak": 64}, "train.py has no flag --lora-rnak"),
        ({"lora_rank": "64"}, "--lora-rank takes int, not '64'"),
        ({"lora_rank": True}, "--lora-rank takes int, not True"),
        ({"colocate": 1}, "--colocate takes bool, not 1"),
        ({"lr": "2e-5"}, "--lr takes float, not '2e-5'"),
    ],
)
def test_a_wrong_name_or_type_names_the_flag(values, message):
    with pytest.raises(TypeError, match=message):
        train_flags(**values)
