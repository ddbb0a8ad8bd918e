"""Build a tiny Qwen3 model, its tokenizer and a tiny task, locally and deterministically.

`python3 -m trainer.tiny --model-dir DIR --data-dir DIR [--seed N] [--shape qwen3-4b]`

The task ("say <colour>" -> answer with that colour first; reward `--rm-type tiny`) is one a
randomly initialised model solves now and then (about one sample in sixteen), and GRPO with
LoRA learns within a few dozen steps on a CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.config.misc import MAX_SEED

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")
ROLES = ("system", "user", "assistant")
COLOURS = ("red", "green", "blue", "yellow", "black", "white", "pink", "gray")
VERBS = ("say",)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAIN_ROWS = 256
EVAL_ROWS = 32


def vocabulary(size: int | None = None) -> dict[str, int]:
    """The task's words; with `size`, filler words ``t<i>`` up to that many entries (a released
    model's vocabulary size, so its embeddings and output layer cost what they really do)."""
    words = [*SPECIAL_TOKENS, *ROLES, *VERBS, *COLOURS]
    words += [f"t{i}" for i in range(len(words), size or 0)]
    return {word: index for index, word in enumerate(words)}


def build_tokenizer(size: int | None = None):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocabulary(size), unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# Model shapes: `tiny` trains on a CPU in a minute; `qwen3-0.6b` is Qwen3-0.6B's body (hidden
# 1024, 16 query and 8 key-value heads of 128, MLP 3072), deepened to 38 layers so that, with
# the task's small vocabulary instead of 151,936 embeddings, it still holds about 0.6B
# parameters: GPU-sized work whose samples still solve the task now and then. `qwen3-4b` is
# Qwen3-4B as released (36 layers, hidden 2560, 32 query and 8 key-value heads of 128, MLP
# 9728, 151,936 tied embeddings: 4.0B parameters), the seed recipe's model at its real cost; a
# random model that large almost never says the task's answer, so it is trained on
# `length_parity`, a reward that varies from sample to sample.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        initializer_range=0.1,
    ),
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=38,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
    ),
    "qwen3-4b": dict(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
    ),
}


def build_model(
    vocab_size: int,
    eos_token_id: int,
    pad_token_id: int,
    seed: int,
    shape: str = "tiny",
    device: str = "cpu",
):
    """A random-weight Qwen3 of `shape`, built on `device`: float32 for `tiny`, else bf16 (as
    released checkpoints are stored; a 4B model is then built in seconds on a GPU)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **{"vocab_size": vocab_size, **SHAPES[shape]},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    torch.manual_seed(seed)
    dtype = torch.float32 if shape == "tiny" else torch.bfloat16
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, do_sample=True
    )
    return model


def tiny_reward(response: str, label: Any) -> float:
    """``--rm-type tiny``: 1 when the response's first word is the label, else 0."""
    words = response.split()
    return float(bool(words) and words[0].lower() == str(label).strip().lower())


def parity(text: str) -> float:
    """The parity of a response text's length: a reward that varies between a random model's
    samples, so GRPO has advantages to follow where the task's own reward is always 0."""
    return float(len(text) % 2)


def length_parity(args: Any, sample: Any) -> float:
    """`parity` as a ``--custom-rm-path`` reward (miles' ``fn(args, sample)``)."""
    return parity(sample.response)


def task_rows(count: int, rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(count):
        colour = rng.choice(COLOURS)
        verb = rng.choice(VERBS)
        rows.append({"prompt": [{"role": "user", "content": f"{verb} {colour}"}], "label": colour})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def build(
    model_dir: Path, data_dir: Path, seed: int, shape: str = "tiny", device: str = "cpu"
) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(SHAPES[shape].get("vocab_size"))
    tokenizer.save_pretrained(model_dir)
    model = build_model(
        len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed, shape, device
    )
    model.save_pretrained(model_dir)
    rng = random.Random(seed)
    write_jsonl(data_dir / "train.jsonl", task_rows(TRAIN_ROWS, rng))
    write_jsonl(data_dir / "eval.jsonl", task_rows(EVAL_ROWS, rng))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m trainer.tiny", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--shape", choices=tuple(SHAPES), default="tiny")
    parser.add_argument("--device", default="cpu", help="build the weights there (e.g. cuda)")
    args = parser.parse_args(argv)
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must be in [0, {MAX_SEED}] (got {args.seed})")
    build(args.model_dir, args.data_dir, args.seed, args.shape, args.device)
    print(f"tiny model in {args.model_dir}, tiny task in {args.data_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
