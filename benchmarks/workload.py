"""`benchmarks/grpo_vs_trl.py`'s workload, the same for every system: the run's `Spec`, the
random model of its shape, the tokenizer and the prompts (built once per node with `--inputs`),
and what a system's step reports (`StepTime`)."""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.backends.sglang import kv_format
from trainer.tiny import SHAPES

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# `--shape`: Qwen3-0.6B as released (`trainer.tiny`'s body with its 28 layers and 151,936
# embeddings), and Qwen3-4B as released (the seed recipe's model).
MODEL_SHAPES = {
    "qwen3-0.6b": {**SHAPES["qwen3-0.6b"], "num_hidden_layers": 28, "vocab_size": 151936},
    "qwen3-4b": SHAPES["qwen3-4b"],
}
# `--kv-cache-dtype`: every engine's KV cache in the model's dtype (bf16), or in 8-bit floating
# point (e4m3: vLLM's fp8); the value is SGLang's name of the format (ours' engine)
KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3"}


@dataclass
class Spec:
    """What every worker builds and runs (picklable: it travels to the worker processes)."""

    work: str
    device: str
    tiny: bool
    prompts: int
    samples: int
    prompt_len: int
    response_len: int
    micro_batch: int
    lr: float
    seed: int
    rollout_backend: str
    shape: str = "qwen3-0.6b"  # a MODEL_SHAPES key (unused with `tiny`)
    ours_flags: list[str] = field(default_factory=list)
    ours_memory: str = "release"  # an OURS_MEMORY key
    vllm_sleep: bool = True  # trl-vllm: vLLM's sleep mode (grpo_vs_trl.py's docstring)
    gradient_checkpointing: bool = False  # every system's own (grpo_vs_trl.py's docstring)
    vllm_memory: float | None = None  # the vLLM systems' GPU share; None: each one's default
    kv_cache_dtype: str = "auto"  # every engine's KV cache: a KV_CACHE_DTYPES key
    inputs: str = ""  # `--inputs`: the model and prompts kept here for later runs; "": in `work`

    @property
    def kv_element_bytes(self) -> float:
        """Bytes of one K or V element in every system's KV cache (the model in bf16)."""
        return kv_format.element_bytes(KV_CACHE_DTYPES[self.kv_cache_dtype], 2)

    @property
    def model_shape(self) -> dict[str, Any]:
        return MODEL_SHAPES[self.shape]

    @property
    def max_positions(self) -> int:
        """The model's context: prompt and response must fit it."""
        return (SHAPES["tiny"] if self.tiny else self.model_shape)["max_position_embeddings"]

    @property
    def model_dir(self) -> str:
        return str(Path(self.inputs or self.work) / "model")

    @property
    def prompt_file(self) -> str:
        return str(Path(self.inputs or self.work) / "prompts.jsonl")

    @property
    def model_key(self) -> dict[str, Any]:
        """What the random model and its tokenizer are built from."""
        return {"tiny": self.tiny, "shape": self.shape, "seed": self.seed, "newline": True}


# Spec fields that say where a run keeps its files, not what it measures
RUN_LOCAL = ("work", "inputs")


@dataclass
class StepTime:
    step_s: float
    rollout_s: float
    response_tokens: int
    total_tokens: int
    phases: dict[str, float] = field(default_factory=dict)  # ours: the loop's `time/*` metrics


# Qwen's tokenizers hold the newline as one token, and verl's rollout for a `qwen3` model
# requires it (its token builder inserts it after `<|im_end|>`); a word-level tokenizer splits
# on whitespace and would drop it
NEWLINE = "\n"


def vocabulary(spec: Spec) -> dict[str, int]:
    """The tiny task's words, filler words ``t<i>`` up to the shape's vocabulary size, and the
    newline last (one token, as in Qwen's tokenizers)."""
    from trainer import tiny as tiny_task

    size = None if spec.tiny else spec.model_shape["vocab_size"] - 1
    words = tiny_task.vocabulary(size)
    return {**words, NEWLINE: len(words)}


def build_tokenizer(spec: Spec, *, eos: bool) -> Any:
    """The tiny task's tokenizer, or a word-level one over ``t<i>`` words for the full vocabulary
    (the tokenizer of the measured TRL baseline), the newline one token of its own. Without
    `eos` it has no end-of-sequence token, so no engine stops early: every response is as long
    as asked."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from trainer import tiny as tiny_task

    backend = Tokenizer(models.WordLevel(vocabulary(spec), unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in tiny_task.SPECIAL_TOKENS]
    )
    backend.add_tokens([AddedToken(NEWLINE, normalized=False)])  # its id in the vocabulary
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>" if eos else None,
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )


def prompt_words(spec: Spec) -> list[str]:
    from trainer import tiny as tiny_task

    if spec.tiny:
        return [*tiny_task.VERBS, *tiny_task.COLOURS]
    return list(vocabulary(spec))[len(tiny_task.vocabulary()) : -1]  # the fillers


def prepare_inputs(spec: Spec, rows: int) -> str:
    """The model (`build_model`) unless `spec.inputs` holds it from an earlier run of the same
    `model_key`, and `rows` prompts (`write_prompts`); says which."""
    started = time.perf_counter()
    key_file = Path(spec.model_dir) / "benchmark-model.json"
    reused = key_file.is_file() and json.loads(key_file.read_text()) == spec.model_key
    if not reused:
        shutil.rmtree(spec.model_dir, ignore_errors=True)
        build_model(spec)
        key_file.write_text(json.dumps(spec.model_key))  # last: a half-built model is rebuilt
    write_prompts(spec, rows)
    took = f"in {time.perf_counter() - started:.1f} s"
    if reused:
        return f"model reused from {spec.model_dir}, prompts written {took}"
    return f"built model and prompts {took}"


def build_model(spec: Spec) -> None:
    """The random-weight model (no EOS in its configs) and tokenizer in `spec.model_dir`."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from trainer import tiny as tiny_task

    tokenizer = build_tokenizer(spec, eos=False)
    tokenizer.save_pretrained(spec.model_dir)
    pad = tokenizer.pad_token_id
    if spec.tiny:
        model = tiny_task.build_model(len(tokenizer), pad, pad, spec.seed)
        model.config.eos_token_id = None
    else:
        config = Qwen3Config(
            **spec.model_shape,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=pad,
        )
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(pad_token_id=pad)
    model.save_pretrained(spec.model_dir)


def write_prompts(spec: Spec, rows: int) -> None:
    """`rows` prompts of `spec.prompt_len` words in `spec.prompt_file`."""
    rng = random.Random(spec.seed)
    words = prompt_words(spec)
    with open(spec.prompt_file, "w", encoding="utf-8") as f:
        for _ in range(rows):
            text = " ".join(rng.choice(words) for _ in range(spec.prompt_len))
            f.write(json.dumps({"prompt": text, "label": "red"}) + "\n")


def prompts_of(spec: Spec) -> list[str]:
    with open(spec.prompt_file, encoding="utf-8") as f:
        return [json.loads(line)["prompt"] for line in f]


def package_versions() -> dict[str, str]:
    """The versions of the packages the systems are made of, as this process finds them."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    names = ("torch", "transformers", "peft", "trl", "datasets", "sglang", "vllm")
    for name in (*names, "unsloth", "unsloth_zoo", "verl", "ray"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found
