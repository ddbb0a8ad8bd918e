"""The bytes one K or V element takes in SGLang's KV-cache formats (``--sglang-kv-cache-dtype``),
for the memory estimate: an 8-bit cache holds twice the tokens of a 16-bit one in the same
memory, and each decode step reads half the bytes per token of context."""

from __future__ import annotations

from trainer.backends.sglang.server_fields import SGLANG_VERSION

# SGLang's formats other than "auto" (the model's dtype), per element with their block scales:
# one 8-bit scale per 32 elements (mxfp8) or per 16 (the 4-bit formats).
ELEMENT_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp8_e5m2": 1.0,
    "fp8_e4m3": 1.0,
    "mxfp8": 1.0 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "fp4_mx_block16": 0.5 + 1 / 16,
    "fp4_e2m1": 0.5 + 1 / 16,
}


class KVFormatError(ValueError):
    pass


def problem(kv_cache_dtype: str | None) -> str | None:
    """What is wrong with `kv_cache_dtype` (``--sglang-kv-cache-dtype``), None if nothing."""
    if kv_cache_dtype in (None, "auto") or kv_cache_dtype in ELEMENT_BYTES:
        return None
    return (
        f"--sglang-kv-cache-dtype {kv_cache_dtype}: not a KV-cache format of SGLang "
        f"{SGLANG_VERSION} (auto, {', '.join(ELEMENT_BYTES)})"
    )


def element_bytes(kv_cache_dtype: str | None, model_dtype_bytes: int) -> float:
    """Bytes per K or V element; `kv_cache_dtype` None or ``auto``: the model's dtype, as SGLang
    stores it. Raises `KVFormatError` where `problem` finds one."""
    if kv_cache_dtype is None or kv_cache_dtype == "auto":
        return float(model_dtype_bytes)
    if kv_cache_dtype not in ELEMENT_BYTES:
        raise KVFormatError(problem(kv_cache_dtype))
    return ELEMENT_BYTES[kv_cache_dtype]
