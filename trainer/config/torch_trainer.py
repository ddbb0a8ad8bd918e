"""Flags of the PyTorch + PEFT trainer (``--train-backend torch``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from trainer.config.flags import flag

AUTO = "auto"


def layer_count(text: str) -> int | str:
    """argparse ``type`` of ``--gradient-checkpointing-layers``: a count or ``auto``."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of layers or auto, not {text!r}"
        ) from None


@dataclass(frozen=True)
class TorchConfig:
    TITLE = "torch backend"

    gradient_checkpointing: bool = flag(
        False,
        help="torch backend: recompute decoder activations in backward (Megatron: --recompute-*)",
    )
    gradient_checkpointing_layers: int | Literal["auto"] = flag(
        -1,
        parse=layer_count,
        metavar="N",
        help="torch backend with --gradient-checkpointing: recompute the first N decoder layers "
        "only and keep the activations of the others (Megatron: --recompute-method block "
        "--recompute-num-layers N): less recomputing for more memory; -1, or N at or above the "
        "model's layers: every layer; 0: none; auto: on a GPU, the fewest whose trainer fits "
        "its memory by the estimate of --colocate-memory auto, decided at start (on the CPU: "
        "every layer)",
    )
    torch_compile_layers: bool = flag(
        False,
        help="torch backend: compile each decoder layer with torch.compile (one graph serves "
        "every layer; with --gradient-checkpointing the checkpoint is compiled with it), and "
        "each chunk of the log-probabilities (its passes over the [tokens, vocab] logits fused): "
        "fewer, fused kernels for a training step whose GPU waits on the host launching them; "
        "the first steps compile (each kind of pass for its first length, then dynamic in the "
        "length)",
    )
    keep_merged_weights: bool = flag(
        True,
        negated="--no-keep-merged-weights",
        help="torch backend with --lora-serving merged: each adapted layer merges its weight "
        "once per optimizer step (and once per log-probability pass) and every pass of the step "
        "(forwards, recomputes, backwards) computes with that copy, for one more copy of the "
        "adapted weights in the training dtype during training (7.3 GB at Qwen3-4B); "
        "--no-keep-merged-weights merges again in every pass and keeps none (with "
        "--torch-compile-layers each merge then breaks the compiled layer's graph)",
    )
    log_probs_chunk_size: int = flag(
        -1,
        help="tokens per chunk of the log-prob/entropy computation (exact either way; smaller "
        "chunks hold less of the [tokens, vocab] logits at once); -1: 512; read by the torch "
        "backend and by Megatron at --tensor-model-parallel-size 1",
    )

    def problems(self) -> Iterator[str]:
        if self.log_probs_chunk_size == 0 or self.log_probs_chunk_size < -1:
            yield f"--log-probs-chunk-size must be -1 or > 0 (got {self.log_probs_chunk_size})"
        layers = self.gradient_checkpointing_layers
        if layers != AUTO and layers < -1:
            yield (
                "--gradient-checkpointing-layers must be -1 (every layer), >= 0 or auto "
                f"(got {layers})"
            )
        elif layers != -1 and not self.gradient_checkpointing:
            yield "--gradient-checkpointing-layers needs --gradient-checkpointing"

    @property
    def checkpointed_layers(self) -> int:
        """The decoder layers recomputed with --gradient-checkpointing (-1: every one). ``auto``
        is decided at the job's start (`trainer.job.colocate_memory`), before anything asks."""
        if self.gradient_checkpointing_layers == AUTO:
            raise ValueError(
                "--gradient-checkpointing-layers auto is undecided until the job weighs its GPU"
            )
        return self.gradient_checkpointing_layers

    def backend_only_flags(self) -> list[str]:
        """Flags given here that no other backend reads: none refused (others ignore them)."""
        return []
