"""Any training setting is set by name, as a launcher's ``--set NAME=VALUE`` does: its dotted
name, its field name or its train.py flag; its value read as train.py reads that flag."""

from __future__ import annotations

import re

import pytest

from trainer.arguments import parse_args, render
from trainer.config.overrides import field_name, override
from trainer.errors import UsageError

BASE = parse_args(["--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl"])


@pytest.mark.parametrize("name", ["lora.lora_rank", "lora_rank", "lora-rank", "--lora-rank"])
def test_every_spelling_names_the_same_field(name):
    assert field_name(name) == "lora_rank"
    assert override(BASE, f"{name}=8").lora.lora_rank == 8


@pytest.mark.parametrize(
    ("assignment", "group", "field", "value"),
    [
        ("lr=2e-5", "optimizer", "lr", 2e-5),
        ("colocate=true", "placement", "colocate", True),
        ("lora-base-cpu-backup=no", "lora", "lora_base_cpu_backup", False),
        ("eval-prompt-data=aime /a b.jsonl", "eval", "eval_prompt_data", ("aime", "/a")),
        ("eval-prompt-data=aime '/a b.jsonl'", "eval", "eval_prompt_data", ("aime", "/a b.jsonl")),
        ("exclude-modules=", "lora", "exclude_modules", None),
        ("rollout-stop-token-ids=1 2", "rollout", "rollout_stop_token_ids", (1, 2)),
        ("loss-agg=token-mean", "algorithm", "loss_agg", "token-mean"),
    ],
)
def test_a_value_reads_as_train_py_reads_its_flag(assignment, group, field, value):
    if assignment.startswith("eval-prompt-data=aime /a b"):
        value = ("aime", "/a", "b.jsonl")
    assert getattr(getattr(override(BASE, assignment), group), field) == value


def test_an_undeclared_sglang_setting_is_one_of_sglangs_own():
    config = override(BASE, "sglang-log-level=warning")
    assert config.sglang.sglang_extra == {"log-level": "warning"}
    assert render(config)[-2:] == ["--sglang-log-level", "warning"]


def test_the_result_renders_and_parses_to_itself():
    config = BASE
    for assignment in ("lora-rank=32", "lr=3e-5", "eps-clip-high=0.28", "colocate=true"):
        config = override(config, assignment)
    assert parse_args(render(config)) == parse_args(render(config))
    assert parse_args(render(config)).lora.lora_rank == 32


@pytest.mark.parametrize(
    ("assignment", "message"),
    [
        ("lora-rnak=3", "train.py has no setting 'lora-rnak' (did you mean --lora-rank?)"),
        ("optimizer.lora_rank=3", "train.py has no setting 'optimizer.lora_rank'"),
        ("lr=fast", "--lr 'fast': invalid float value: 'fast'"),
        ("optimizer=sgd", "invalid choice: 'sgd'"),
        ("colocate=maybe", "--colocate takes true or false, not 'maybe'"),
        ("lora-rank", "--set 'lora-rank': give NAME=VALUE"),
    ],
)
def test_a_bad_setting_is_one_line(assignment, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        override(BASE, assignment)
