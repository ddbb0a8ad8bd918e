"""Device and dtype helpers shared by the backends (torch imported lazily)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer.backends.flat_tensors import FlatTensors

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


def host_copies(
    tensors: Mapping[str, Any], device: Any, *, reuse: FlatTensors | None = None
) -> FlatTensors:
    """Copies of `tensors` in one host buffer, page-locked where `device` is a GPU (so that
    copies from it to the GPU run asynchronously) and made in one allocation, or copied into
    `reuse` (an earlier result) where its names, dtypes and shapes are these. Not one buffer
    per tensor: pinning host memory is a slow allocation, and a set of copies can hold a
    thousand tensors (Adam's state at Qwen3-4B with r64 on every linear layer: 1,008)."""
    import torch

    specs = [(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in tensors.items()]
    if reuse is not None and [(e.name, e.dtype, e.shape) for e in reuse.entries] == specs:
        copies = reuse
    else:
        pin = torch.device(device).type == "cuda"
        copies = FlatTensors.allocate(specs, device="cpu", pin_memory=pin)
    for name, tensor in tensors.items():
        copies[name].copy_(tensor, non_blocking=True)
    synchronize(device)  # the copies complete before anything reads them on the host
    return copies


def gpu_index(device: str) -> int:
    """``cuda:3`` -> 3; ``cuda`` -> 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0
