"""`layer_activations`' table against what the PEFT trainer itself keeps for backward: one
training step of `PeftPolicyTrainer` on the CPU in bf16 under `saved_tensors_hooks` (each
storage once, the model's parameters left out), for a model of one and of two decoder layers
and two sequence lengths, so that one layer's bytes per token remain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.job import colocate_memory, layer_activations
from trainer.job.layer_activations import LayerWidths

VOCAB = 64
TOKENS = 32

WIDTHS = {
    "grouped-query": LayerWidths(64, 4, 2, 16, 128, lora_rank=4, adapted_linears=7),
    "wide-mlp": LayerWidths(96, 6, 2, 16, 352, lora_rank=8, adapted_linears=7),
    "wide-heads": LayerWidths(80, 4, 4, 32, 160, lora_rank=4, adapted_linears=7),
}


def checkpoint(root: Path, widths: LayerWidths, layers: int) -> Path:
    """A random Qwen3 of `widths` and `layers` decoder layers, saved in bf16."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sizes = (widths.hidden, widths.heads, widths.kv_heads, widths.head_dim, widths.mlp, layers)
    path = root / "-".join(map(str, sizes))
    if not path.exists():
        config = Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=widths.hidden,
            num_attention_heads=widths.heads,
            num_key_value_heads=widths.kv_heads,
            head_dim=widths.head_dim,
            intermediate_size=widths.mlp,
            num_hidden_layers=layers,
            tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def saved_bytes(model_dir: Path, widths: LayerWidths, tokens: int, **options: Any) -> int:
    """Bytes autograd keeps for backward over one training step of one row of `tokens`."""
    import torch

    from trainer.backends.base import TrainBatch
    from trainer.backends.torch.trainer import PeftPolicyTrainer
    from trainer.config import LoraConfig, OptimizerConfig

    trainer = PeftPolicyTrainer(
        str(model_dir),
        LoraConfig(lora_rank=widths.lora_rank, lora_alpha=16.0, target_modules="all-linear"),
        OptimizerConfig(lr=1e-5),
        total_steps=1,
        device="cpu",
        dtype="bf16",
        **options,
    )
    parameters = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    kept: dict[int, Any] = {}  # held until the count ends, so no address is reused

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage
        return tensor

    ids = torch.randint(VOCAB, (1, tokens), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, tokens - 1)
    batch = TrainBatch(ids, torch.ones_like(ids), mask)

    def loss(out: Any, batch: Any) -> tuple[Any, dict[str, float]]:
        return -(out.logprobs * batch.loss_mask).mean(), {}

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer.train_step([batch], loss)
    return sum(storage.nbytes() for storage in kept.values())


def counted_bytes_per_token(root: Path, widths: LayerWidths, **options: Any) -> float:
    def one_layer(tokens: int) -> int:
        two, one = (checkpoint(root, widths, layers) for layers in (2, 1))
        return saved_bytes(two, widths, tokens, **options) - saved_bytes(
            one, widths, tokens, **options
        )

    return (one_layer(2 * TOKENS) - one_layer(TOKENS)) / TOKENS


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("layers")


@pytest.mark.parametrize("merged", [False, True], ids=["peft", "merged"])
@pytest.mark.parametrize("name", list(WIDTHS))
def test_an_eager_layer_keeps_what_the_table_says(root, name, merged):
    widths = WIDTHS[name]
    layer = layer_activations.torch_layer(compiled=False, merged=merged)
    counted = counted_bytes_per_token(root, widths, merged=merged)
    assert counted == pytest.approx(layer.bytes_per_token(widths), rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("merged", [False, True], ids=["peft", "merged"])
@pytest.mark.parametrize("name", ["wide-mlp"])
def test_a_compiled_layer_keeps_what_the_table_says(root, name, merged):
    widths = WIDTHS[name]
    layer = layer_activations.torch_layer(compiled=True, merged=merged)
    counted = counted_bytes_per_token(root, widths, merged=merged, compile_layers=True)
    assert counted == pytest.approx(layer.bytes_per_token(widths), rel=0.01)


def test_the_merged_policy_keeps_less_and_compiling_less_again():
    """At Qwen3-4B's widths with the benchmark's LoRA (r64 on all 7 linear layers): PEFT's
    eager layer 68.1 x hidden a token, merged 58.5, compiled and merged 42.9."""
    qwen3_4b = LayerWidths(2560, 32, 8, 128, 9728, lora_rank=64, adapted_linears=7)
    per_hidden = {
        (compiled, merged): round(
            layer_activations.torch_layer(compiled=compiled, merged=merged).bytes_per_token(
                qwen3_4b
            )
            / qwen3_4b.hidden,
            1,
        )
        for compiled in (False, True)
        for merged in (False, True)
    }
    assert per_hidden == {
        (False, False): 68.1,
        (False, True): 58.5,
        (True, False): 46.5,
        (True, True): 42.9,
    }


def test_each_backend_and_flag_picks_its_layer(tmp_path):
    from trainer import tiny
    from trainer.arguments import parse_args

    model = tmp_path / "model"
    tiny.build(model, tmp_path / "data", seed=0)

    def layer(*extra: str) -> layer_activations.LayerActivations:
        config = parse_args(["--hf-checkpoint", str(model), "--prompt-data", "p.jsonl", *extra])
        return colocate_memory.trainer_layer(config)

    assert layer() is layer_activations.EAGER_PEFT
    assert layer("--lora-serving", "merged") is layer_activations.EAGER_MERGED
    assert layer("--torch-compile-layers") is layer_activations.COMPILED_PEFT
    merged_compiled = layer("--torch-compile-layers", "--lora-serving", "merged")
    assert merged_compiled is layer_activations.COMPILED_MERGED
    assert layer("--train-backend", "megatron") is layer_activations.KORTHIKANTI
