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

    megatron_to_hf_mode: str = flag("bridge", choices=("raw", "bridge"))
    tensor_model_parallel_size: int = flag(1)
    pipeline_model_parallel_size: int = flag(1)
    context_parallel_size: int = flag(1)
    expert_model_parallel_size: int = flag(1)
    sequence_parallel: bool = flag(False)
    recompute_granularity: str | None = flag(None, choices=("full", "selective"))
    recompute_method: str | None = flag(None, choices=("uniform", "block"))
    recompute_num_layers: int | None = flag(None)
    use_dynamic_batch_size: bool = flag(False)
    max_tokens_per_gpu: int | None = flag(None)
    attention_dropout: float = flag(0.0)
    hidden_dropout: float = flag(0.0)
    accumulate_allreduce_grads_in_fp32: bool = flag(False)
    attention_softmax_in_fp32: bool = flag(False)

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
