"""Device and dtype helpers shared by the portable backends (torch imported lazily)."""

from __future__ import annotations

from typing import Any

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, _DTYPES[dtype])


def empty_cache(device: Any) -> None:
    import torch

    if getattr(device, "type", device) == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
