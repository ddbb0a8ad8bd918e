"""Flags of the PyTorch + PEFT trainer (``--train-backend torch``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag


@dataclass(frozen=True)
class TorchConfig:
    TITLE = "torch backend"

    gradient_checkpointing: bool = flag(
        False,
        help="torch backend: recompute decoder activations in backward (Megatron: --recompute-*)",
    )
    gradient_checkpointing_layers: int = flag(
        -1,
        help="torch backend with --gradient-checkpointing: recompute the first N decoder layers "
        "only and keep the activations of the others (Megatron: --recompute-method block "
        "--recompute-num-layers N): less recomputing for more memory; -1, or N at or above the "
        "model's layers: every layer; 0: none",
    )
    torch_compile_layers: bool = flag(
        False,
        help="torch backend: compile each decoder layer with torch.compile (one graph serves "
        "every layer; with --gradient-checkpointing the checkpoint is compiled with it): fewer, "
        "fused kernels for a training step whose GPU waits on the host launching them; the first "
        "steps compile (each kind of pass for its first length, then dynamic in the length)",
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
        if self.gradient_checkpointing_layers < -1:
            yield (
                "--gradient-checkpointing-layers must be -1 (every layer) or >= 0 "
                f"(got {self.gradient_checkpointing_layers})"
            )
        elif self.gradient_checkpointing_layers != -1 and not self.gradient_checkpointing:
            yield "--gradient-checkpointing-layers needs --gradient-checkpointing"

    def backend_only_flags(self) -> list[str]:
        """Flags given here that no other backend reads: none refused (others ignore them)."""
        return []
