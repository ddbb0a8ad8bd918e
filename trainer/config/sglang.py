"""Flags of the SGLang rollout engines (``--rollout-backend sglang``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from common.secrets import REDACTED, is_secret
from trainer.config.flags import collected, flag, flag_fields, option

PREFIX = "--sglang-"


@dataclass(frozen=True)
class SGLangConfig:
    TITLE = "sglang (any other --sglang-<name> VALUE goes to args.sglang_extra)"

    sglang_mem_fraction_static: float | None = flag(
        None,
        help="SGLang's mem_fraction_static: share of an engine GPU's memory for its weights and KV "
        "cache (colocated, the rest is the trainer's; --colocate-memory auto needs it); unset: "
        "SGLang's choice",
    )
    sglang_chunked_prefill_size: int | None = flag(
        None,
        help="SGLang's chunked_prefill_size: most tokens prefilled in one chunk (-1: no "
        "chunking); smaller lowers the peak memory of long prompts; unset: SGLang's choice",
    )
    sglang_lora_backend: str | None = flag(
        None,
        help="SGLang's lora_backend, the kernels that apply the adapter (e.g. triton, csgmv); "
        "ignored with --lora-serving merged; unset: SGLang's choice",
    )
    sglang_attention_backend: str | None = flag(
        None,
        help="SGLang's attention_backend (e.g. flashinfer, triton, fa3); unset: SGLang's choice",
    )
    # every undeclared --sglang-<name> VALUE, by <name> (dashes): a ServerArgs field
    sglang_extra: dict[str, str] = collected(dict)

    def shown_extra(self) -> dict[str, str]:
        """`sglang_extra` with the values of secret-looking names redacted, sorted."""
        return {k: (REDACTED if is_secret(k) else v) for k, v in sorted(self.sglang_extra.items())}

    def problems(self) -> Iterator[str]:
        fraction = self.sglang_mem_fraction_static
        if fraction is not None and not 0.0 < fraction < 1.0:
            yield f"--sglang-mem-fraction-static must be in (0, 1) (got {fraction})"

    def backend_only_flags(self) -> list[str]:
        """The flags given here (names only: a value may be a secret)."""
        declared = [
            option(f.name) for f, _ in flag_fields(self) if getattr(self, f.name) is not None
        ]
        return declared + [PREFIX + key for key in sorted(self.sglang_extra)]
