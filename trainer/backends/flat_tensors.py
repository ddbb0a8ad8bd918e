"""Named tensors in one byte buffer.

On its way from the trainer to a rollout engine an adapter (392 tensors for a 0.6B model's
all-linear LoRA) would cost a copy to the host, a pickle through Ray and a concatenation into
SGLang's flattened bucket per tensor. `FlatTensors` packs them once, where they are (on the
GPU: one concatenation there, then one copy to the host), into a contiguous ``uint8`` buffer:
it reads as a mapping of views, pickles as that one buffer plus names, dtypes, shapes and
offsets, and is already the layout of SGLang's ``FlattenedTensorBucket``.

Its views share the buffer: clone them before handing them to something that refuses shared
memory (``safetensors``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# Every tensor starts at a multiple of this many bytes, so each view is aligned for its dtype.
ALIGNMENT = 16


@dataclass(frozen=True)
class FlatEntry:
    """Where one tensor lies in the buffer: bytes ``start:end``."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def layout(specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]) -> tuple[FlatEntry, ...]:
    """Consecutive entries for tensors of the given (name, dtype, shape), each aligned."""
    import math

    entries: list[FlatEntry] = []
    start = 0
    for name, dtype, shape in specs:
        start += -start % ALIGNMENT
        end = start + math.prod(shape) * dtype.itemsize
        entries.append(FlatEntry(name, dtype, tuple(shape), start, end))
        start = end
    return tuple(entries)


class FlatTensors(Mapping[str, "torch.Tensor"]):
    """`entries` of a 1-D contiguous ``uint8`` `buffer`, as a read-only mapping of views."""

    def __init__(self, buffer: torch.Tensor, entries: tuple[FlatEntry, ...]) -> None:
        import torch

        if buffer.dtype != torch.uint8 or buffer.dim() != 1 or not buffer.is_contiguous():
            raise ValueError(f"the buffer must be 1-D contiguous uint8, got {buffer.dtype}")
        self.buffer = buffer
        self.entries = tuple(entries)
        self._by_name = {entry.name: entry for entry in self.entries}

    @classmethod
    def pack(cls, tensors: Mapping[str, torch.Tensor], *, device: Any = None) -> FlatTensors:
        """`tensors` (all on one device) concatenated there, then moved to `device` in one copy."""
        import torch

        entries = layout((name, t.dtype, tuple(t.shape)) for name, t in tensors.items())
        parts: list[torch.Tensor] = []
        end = 0
        for entry, tensor in zip(entries, tensors.values(), strict=True):
            if entry.start > end:
                parts.append(
                    torch.zeros(entry.start - end, dtype=torch.uint8, device=tensor.device)
                )
            parts.append(tensor.detach().reshape(-1).view(torch.uint8))
            end = entry.end
        buffer = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
        return cls(buffer if device is None else buffer.to(device), entries)

    @classmethod
    def allocate(
        cls,
        specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]],
        *,
        device: Any,
        pin_memory: bool = False,
    ) -> FlatTensors:
        """Room for tensors of the given (name, dtype, shape) on `device`, uninitialised: fill
        its views in place, without a second copy of them all. `pin_memory` (a host buffer):
        page-locked, in one allocation however many tensors it holds."""
        import torch

        entries = layout(specs)
        size = entries[-1].end if entries else 0
        buffer = torch.empty(size, dtype=torch.uint8, device=device, pin_memory=pin_memory)
        return cls(buffer, entries)

    def __getitem__(self, name: str) -> torch.Tensor:
        entry = self._by_name[name]
        return self.buffer[entry.start : entry.end].view(entry.dtype).reshape(entry.shape)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self.entries)

    def __reduce__(self) -> tuple[Any, ...]:
        return (FlatTensors, (self.buffer, self.entries))
