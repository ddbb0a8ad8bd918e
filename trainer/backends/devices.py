"""Device and dtype helpers shared by the backends (torch imported lazily)."""

from __future__ import annotations

from typing import Any

_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, _DTYPES[dtype])


def empty_cache(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()


def synchronize(device: Any) -> None:
    """Wait for the work queued on GPU `device` (nothing to wait for on a CPU)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def host_buffer(like: Any, device: Any) -> Any:
    """An empty host tensor of `like`'s shape and dtype, page-locked where `device` is a GPU so
    that copies from it to the GPU run asynchronously."""
    import torch

    pin = torch.device(device).type == "cuda"
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pin)


def gpu_index(device: str) -> int:
    """``cuda:3`` -> 3; ``cuda`` -> 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0
