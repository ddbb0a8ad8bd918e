"""The tiny Qwen3 model, tokenizer and task that the CPU launcher trains on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trainer import tiny
from trainer.grpo.rewards import get_reward


def digest(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    assert tiny.main(["--model-dir", str(root / "m"), "--data-dir", str(root / "d")]) == 0
    return root


def test_the_build_is_deterministic_and_the_seed_matters(built, tmp_path):
    tiny.build(tmp_path / "m", tmp_path / "d", seed=1234)
    assert digest(tmp_path / "m") == digest(built / "m")
    assert digest(tmp_path / "d") == digest(built / "d")
    tiny.build(tmp_path / "m2", tmp_path / "d2", seed=7)
    other = digest(tmp_path / "m2")
    assert other["model.safetensors"] != digest(built / "m")["model.safetensors"]
    assert other["tokenizer.json"] == digest(built / "m")["tokenizer.json"]


def test_model_is_a_small_qwen3_sized_to_its_tokenizer(built):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(built / "m")
    tokenizer = AutoTokenizer.from_pretrained(built / "m")
    assert config.model_type == "qwen3"
    assert config.architectures == ["Qwen3ForCausalLM"]
    assert config.vocab_size == len(tokenizer)
    assert (
        config.eos_token_id
        == tokenizer.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|im_end|>")
    )
    assert config.pad_token_id == tokenizer.pad_token_id


def test_chat_template_renders_qwen_style_and_round_trips(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built / "m")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "say blue"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nsay blue<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "<|im_start|>", "user", "say", "blue", "<|im_end|>", "<|im_start|>", "assistant",
    ]  # fmt: skip
    response = [*tokenizer.encode("blue red", add_special_tokens=False), tokenizer.eos_token_id]
    assert tokenizer.decode(response, skip_special_tokens=True) == "blue red"


def test_task_rows_are_chat_prompts_with_a_label(built):
    rows = [json.loads(line) for line in (built / "d" / "train.jsonl").read_text().splitlines()]
    evals = (built / "d" / "eval.jsonl").read_text().splitlines()
    assert len(rows) == tiny.TRAIN_ROWS and len(evals) == tiny.EVAL_ROWS
    for row in rows:
        assert row["prompt"] == [{"role": "user", "content": f"say {row['label']}"}]
        assert row["label"] in tiny.COLOURS
    assert {row["label"] for row in rows} == set(tiny.COLOURS)


@pytest.mark.parametrize(
    ("response", "label", "reward"),
    [
        ("red", "red", 1.0),
        ("red blue gray", "red", 1.0),
        ("  Red ", "red", 1.0),
        ("blue red", "red", 0.0),
        ("", "red", 0.0),
        ("say", "red", 0.0),
    ],
)
def test_tiny_reward_is_registered_and_scores_the_first_word(response, label, reward):
    assert get_reward("tiny")(response, label) == reward


def test_an_untrained_model_earns_the_reward_now_and_then(built):
    """GRPO needs some successes in the first rollouts, and room to improve."""
    from transformers import AutoTokenizer

    from trainer.backends.base import SamplingParams
    from trainer.backends.torch.rollout import HFRolloutEngine

    tokenizer = AutoTokenizer.from_pretrained(built / "m")
    engine = HFRolloutEngine(str(built / "m"))
    rows = [json.loads(line) for line in (built / "d" / "eval.jsonl").read_text().splitlines()]
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
        for r in rows
        for _ in range(8)
    ]
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    generations = engine.generate(ids, SamplingParams(max_new_tokens=4, seed=0))
    labels = [r["label"] for r in rows for _ in range(8)]
    rewards = [
        tiny.tiny_reward(tokenizer.decode(g.response_ids, skip_special_tokens=True), label)
        for g, label in zip(generations, labels, strict=True)
    ]
    rate = sum(rewards) / len(rewards)
    assert 0.02 < rate < 0.35


def test_the_qwen3_4b_shape_is_qwen3_4b_with_its_whole_vocabulary():
    """The seed recipe's model at its real size (built on the meta device: no memory)."""
    tokenizer = tiny.build_tokenizer(tiny.SHAPES["qwen3-4b"]["vocab_size"])
    assert len(tokenizer) == 151936
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("say red")) == ["say", "red"]
    model = tiny.build_model(len(tokenizer), 5, 0, seed=0, shape="qwen3-4b", device="meta")
    assert model.config.tie_word_embeddings and model.config.num_hidden_layers == 36
    assert sum(p.numel() for p in model.parameters()) == 4_022_468_096


def test_length_parity_varies_with_the_response():
    from trainer.grpo.rewards import RewardSample

    rewards = [
        tiny.length_parity(None, RewardSample("p", response, "red", {}, None))
        for response in ("ab", "abc")
    ]
    assert rewards == [0.0, 1.0]
