"""The PEFT trainer's pre-launch check of ``--target-modules`` against the checkpoint, on the
meta device (the end-to-end refusal before Ray starts is in test_loop)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainer import tiny
from trainer.arguments import parse_args
from trainer.backends.torch import targets as peft_targets


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=0)
    return root / "model"


def problem(model: Path, *lora: str) -> str | None:
    config = parse_args(["--hf-checkpoint", str(model), "--prompt-data", "p.jsonl", *lora])
    return peft_targets.problem(config)


def test_targets_the_model_has_pass_served_as_adapter_or_merged(model_dir):
    assert problem(model_dir) is None
    assert problem(model_dir, "--lora-serving", "merged") is None
    assert problem(model_dir, "--target-modules", "embed_tokens,q_proj") is None


def test_a_target_the_model_lacks_is_named(model_dir):
    """PEFT adapts what matches and ignores the rest of a list; a misspelt target is refused."""
    assert problem(model_dir, "--target-modules", "q_proj,qproj") == (
        f"--target-modules: {model_dir} has no module named 'qproj' "
        "(did you mean q_proj, v_proj, o_proj?)"
    )
    assert problem(model_dir, "--target-modules", "self_attn.q_proj,nothing_like_it") == (
        f"--target-modules: {model_dir} has no module named 'nothing_like_it'"
    )


def test_merged_serving_refuses_a_layer_that_is_not_linear(model_dir):
    assert problem(
        model_dir, "--target-modules", "embed_tokens,q_proj", "--lora-serving", "merged"
    ) == (
        "--lora-serving merged merges linear layers; model.embed_tokens is a Embedding: "
        "leave it out of --target-modules"
    )


def test_a_config_transformers_cannot_build_is_one_line(model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "no-such-model"}))
    line = problem(broken)
    assert line is not None and "\n" not in line
    assert line.startswith(f"--hf-checkpoint {broken}: transformers cannot build its model (")


def test_merged_serving_refuses_a_transposed_conv1d_layer(tmp_path):
    """GPT-2's ``Conv1D`` keeps its weight as [in, out]: PEFT's LoRA ``Linear`` wraps it, the
    merge (``W + B @ A``, [out, in]) does not fit it."""
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32).save_pretrained(tmp_path)
    assert problem(tmp_path, "--target-modules", "c_attn") is None
    assert problem(tmp_path, "--target-modules", "c_attn", "--lora-serving", "merged") == (
        "--lora-serving merged merges linear layers; transformer.h.0.attn.c_attn is a Conv1D: "
        "leave it out of --target-modules"
    )
