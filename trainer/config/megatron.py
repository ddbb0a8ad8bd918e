"""Flags of the Megatron-Bridge trainer (``--train-backend megatron``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag, fraction, option, positive

PARALLEL_SIZES = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


@dataclass(frozen=True)
class MegatronConfig:
    TITLE = "megatron"

    megatron_to_hf_mode: str = flag(
        "bridge",
        choices=("raw", "bridge"),
        help="how the Megatron trainer exports the adapter under PEFT names for the engines: "
        "Megatron-Bridge's exporter (bridge) or this project's exact conversion (raw) "
        "(miles: raw, which there converts the full weights)",
    )
    tensor_model_parallel_size: int = flag(
        1, help="tensor parallelism: GPUs each layer's weights are split over (Megatron only)"
    )
    pipeline_model_parallel_size: int = flag(
        1, help="pipeline parallelism: stages the layers are split over (Megatron only)"
    )
    context_parallel_size: int = flag(
        1, help="context parallelism: GPUs each sequence is split over (Megatron only)"
    )
    expert_model_parallel_size: int = flag(
        1,
        help="expert parallelism: GPUs the MoE experts are spread over (Megatron only; LoRA on "
        "experts is not supported)",
    )
    sequence_parallel: bool = flag(
        False,
        help="with tensor parallelism, also split the activations outside the split layers "
        "(norms, dropout) along the sequence; needs --tensor-model-parallel-size > 1",
    )
    recompute_granularity: str | None = flag(
        None,
        choices=("full", "selective"),
        help="Megatron activation recomputation in backward: whole layers (full; needs "
        "--recompute-method and --recompute-num-layers) or the attention core (selective)",
    )
    recompute_method: str | None = flag(
        None,
        choices=("uniform", "block"),
        help="with --recompute-granularity full: recompute every group of "
        "--recompute-num-layers layers (uniform) or the first --recompute-num-layers layers of "
        "each pipeline stage (block)",
    )
    recompute_num_layers: int | None = flag(
        None, help="layers per recomputed group (uniform) or per pipeline stage (block)"
    )
    use_dynamic_batch_size: bool = flag(
        False,
        help="Megatron: pack each rank's micro-batches by --max-tokens-per-gpu instead of "
        "--micro-batch-size samples (the loss is the same); the torch backend ignores it",
    )
    max_tokens_per_gpu: int | None = flag(
        None,
        help="token budget of a micro-batch with --use-dynamic-batch-size: rows x longest row, "
        "padding included, counted before context-parallel splitting (miles: the summed "
        "lengths x CP size); a longer sample gets a micro-batch of its own",
    )
    attention_dropout: float = flag(
        0.0, help="Megatron's dropout rate of the attention probabilities (miles: 0.1)"
    )
    hidden_dropout: float = flag(
        0.0,
        help="Megatron's dropout rate after the attention and MLP blocks (miles: 0.1)",
    )
    accumulate_allreduce_grads_in_fp32: bool = flag(
        False, help="Megatron: accumulate and all-reduce the gradients in float32"
    )
    attention_softmax_in_fp32: bool = flag(
        False, help="Megatron: compute the attention's masking and softmax in float32"
    )

    @property
    def model_parallel_size(self) -> int:
        """Ranks one copy of the model spans: TP x PP x CP."""
        return (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.context_parallel_size
        )

    def problems(self) -> Iterator[str]:
        yield from positive(self, *PARALLEL_SIZES, "recompute_num_layers", "max_tokens_per_gpu")
        yield from fraction(self, "attention_dropout", "hidden_dropout")
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            yield "--sequence-parallel needs --tensor-model-parallel-size > 1"
        if self.use_dynamic_batch_size and self.max_tokens_per_gpu is None:
            yield "--use-dynamic-batch-size needs --max-tokens-per-gpu"
        if self.recompute_method is not None and self.recompute_granularity != "full":
            yield "--recompute-method needs --recompute-granularity full"
        if self.recompute_num_layers is not None and self.recompute_method is None:
            yield "--recompute-num-layers needs --recompute-method"
        if self.recompute_granularity == "full" and None in (
            self.recompute_method,
            self.recompute_num_layers,
        ):
            yield "--recompute-granularity full needs --recompute-method and --recompute-num-layers"

    def backend_only_flags(self) -> list[str]:
        """The parallel sizes above 1, which only Megatron can honour."""
        return [
            f"{option(name)} {getattr(self, name)}"
            for name in PARALLEL_SIZES
            if getattr(self, name) > 1
        ]
