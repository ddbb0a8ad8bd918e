"""The LoRA adapter: its shape and the modules it wraps."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainer.config.flags import flag, fraction, positive, split_list

ALL_LINEAR = "all-linear"
ADAPTER, MERGED = "adapter", "merged"


@dataclass(frozen=True)
class LoraConfig:
    TITLE = "LoRA"

    lora_rank: int = flag(
        16,
        help="rank r of every LoRA adapter, also SGLang's max_lora_rank; LoRA is always on, so "
        "> 0 (miles: 0, LoRA off)",
    )
    lora_alpha: float = flag(
        32.0, help="LoRA scale numerator: an adapter's output is scaled by alpha / r (miles: 16)"
    )
    lora_dropout: float = flag(
        0.0,
        help="dropout on the adapters' input; only 0 is accepted (the old log-probs come without "
        "dropout, so any other rate skews the PPO ratio)",
    )
    target_modules: str = flag(ALL_LINEAR, help='comma list or "all-linear"')
    exclude_modules: str | None = flag(None, help="comma list of modules to leave without LoRA")
    lora_base_cpu_backup: bool = flag(
        False,
        help="colocated with memory release: while the engines generate, the trainer frees the "
        "GPU copy of the frozen base weights (restored from pinned CPU memory) and an SGLang "
        "engine frees its weights too (enable_weights_cpu_backup); more free GPU memory for a "
        "host-to-device copy per rollout",
    )
    lora_serving: str = flag(
        ADAPTER,
        choices=(ADAPTER, MERGED),
        help="how the rollout engines serve the policy: the base with the adapter through their "
        "LoRA kernels (adapter), or the adapter merged into the base's linear weights, served "
        "without LoRA kernels (merged: faster decoding; the policy is then the merged weights "
        "rounded to the engines' dtype, and the trainer computes through those same weights, "
        "the adapter's gradients passing the rounding; --train-backend torch only)",
    )

    @property
    def merged(self) -> bool:
        """The engines serve the adapter merged into the base (``--lora-serving merged``)."""
        return self.lora_serving == MERGED

    def modules(self) -> str | tuple[str, ...]:
        """``"all-linear"`` or the names of the modules LoRA wraps, as given."""
        return ALL_LINEAR if self.target_modules == ALL_LINEAR else split_list(self.target_modules)

    def excluded(self) -> tuple[str, ...]:
        return split_list(self.exclude_modules)

    def problems(self) -> Iterator[str]:
        yield from positive(self, "lora_rank", "lora_alpha")
        yield from fraction(self, "lora_dropout")
        if self.lora_dropout > 0:
            yield (
                f"--lora-dropout {self.lora_dropout} is refused: old log-probs come without "
                "dropout and the training forward drops out, so the on-policy PPO ratio is not 1; "
                "use 0"
            )
        if self.target_modules != ALL_LINEAR:
            modules = split_list(self.target_modules)
            if not modules:
                yield '--target-modules must be "all-linear" or a comma list of module names'
            elif ALL_LINEAR in modules:
                yield '--target-modules: "all-linear" cannot be combined with module names'
