"""A checkpoint's `ModelShape` for the memory estimate, from files alone (no torch): the sizes
from ``config.json``, the exact parameter count from the ``*.safetensors`` headers (safetensors
reads only the header for a tensor's shape)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from trainer.backends.lora_merge import adapts, checkpoint_shapes
from trainer.job.layer_activations import LayerWidths
from trainer.job.memory_estimate import ModelShape


class ModelShapeError(ValueError):
    """The checkpoint does not say how large the model is (one line)."""


def tensor_shapes(model_dir: Path) -> Iterator[tuple[str, list[int]]]:
    """(name, shape) of every tensor in the checkpoint's safetensors files."""
    if not any(model_dir.glob("*.safetensors")):
        raise ModelShapeError(f"{model_dir}: no *.safetensors files to size the model from")
    yield from checkpoint_shapes(model_dir)


def adapted_shapes(
    shapes: Sequence[tuple[str, list[int]]], targets: Sequence[str]
) -> list[list[int]]:
    """The [out, in] shapes of the weights LoRA on `targets` adapts (`lora_merge.adapts`)."""
    wanted = set(targets)
    return [shape for name, shape in shapes if adapts(name, shape, wanted)]


def _text_config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    return config.get("text_config", config)


def read(model_dir: Path, *, lora_rank: int, lora_targets: Sequence[str]) -> ModelShape:
    shapes = list(tensor_shapes(model_dir))
    config = _text_config(model_dir)
    try:
        hidden, layers = config["hidden_size"], config["num_hidden_layers"]
        heads, vocab = config["num_attention_heads"], config["vocab_size"]
        mlp = config["intermediate_size"]
    except KeyError as err:
        raise ModelShapeError(f"{model_dir}/config.json lacks {err.args[0]}") from None
    adapted = adapted_shapes(shapes, lora_targets)
    widths = LayerWidths(
        hidden=hidden,
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or hidden // heads,
        mlp=mlp,
        lora_rank=lora_rank,
        adapted_linears=math.ceil(len(adapted) / layers),
    )
    return ModelShape(
        parameters=sum(math.prod(shape) for _, shape in shapes),
        lora_parameters=sum(lora_rank * (out + in_) for out, in_ in adapted),
        layer=widths,
        num_layers=layers,
        vocab_size=vocab,
        adapted_parameters=sum(out * in_ for out, in_ in adapted),
    )
