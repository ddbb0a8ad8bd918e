"""Micro-batch shaping for the Megatron trainer: dynamic batching and context-parallel slicing.

Pure (torch only). Sequences are right-padded rows; a micro-batch costs ``rows x longest row``
tokens on the GPU, so `pack_by_token_budget` groups rows of similar length under
``--max-tokens-per-gpu``. `regroup` rebuilds `TrainBatch` micro-batches from any grouping of the
step's rows: per-row tensors (``[B]``), per-position tensors (``[B, S]``) and per-token tensors
aligned with ``input_ids[:, 1:]`` (``[B, S-1]``) are all carried along. Regrouping is exact for a
loss whose normalisers are step-wide (what the loop's pre-scaled loss provides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from trainer.backends.base import TrainBatch

if TYPE_CHECKING:
    import torch


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pack_by_token_budget(
    lengths: Sequence[int], max_tokens: int, *, min_groups: int = 1
) -> list[list[int]]:
    """Group row indices so that ``len(group) * max(length in group) <= max_tokens``.

    Rows are taken longest first, so each group pads little. A row longer than the budget gets a
    group of its own (it cannot be split). At least `min_groups` groups are returned when there
    are that many rows (the largest groups are halved), so data-parallel ranks can agree on a
    common micro-batch count. Deterministic; each group lists indices in ascending order.
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be > 0 (got {max_tokens})")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    for index in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= max_tokens:
            groups[-1].append(index)
        else:
            groups.append([index])
    while len(groups) < min(min_groups, len(lengths)):
        largest = max(range(len(groups)), key=lambda g: (len(groups[g]), -g))
        group = groups.pop(largest)
        half = len(group) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return [sorted(group) for group in groups]


def row_lengths(batch: TrainBatch) -> list[int]:
    """Tokens per right-padded row (``attention_mask`` sums)."""
    return [int(n) for n in batch.attention_mask.sum(dim=1).tolist()]


def _seq_offset(tensor: torch.Tensor | None, seq: int) -> int | None:
    """0 for per-position (``[B, S, ...]``), 1 for per-token (``[B, S-1, ...]``), else None."""
    if tensor is None or tensor.dim() < 2:
        return None
    if tensor.shape[1] == seq:
        return 0
    return 1 if tensor.shape[1] == seq - 1 else None


def _pad_to(tensor: torch.Tensor, width: int) -> torch.Tensor:
    import torch.nn.functional as F

    if tensor.shape[1] == width:
        return tensor
    pad = [0, 0] * (tensor.dim() - 2) + [0, width - tensor.shape[1]]
    return F.pad(tensor, pad)


def _concat(batches: Sequence[TrainBatch]) -> TrainBatch:
    """Stack the rows of several micro-batches, right-padding to a common length."""
    import torch

    width = max(b.input_ids.shape[1] for b in batches)

    def join(values: list[torch.Tensor | None]) -> torch.Tensor | None:
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise ValueError("a TrainBatch field is set in some micro-batches and not others")
        padded = []
        for value, batch in zip(values, batches, strict=True):
            offset = _seq_offset(value, batch.input_ids.shape[1])
            padded.append(value if offset is None else _pad_to(value, width - offset))
        return torch.cat(padded, dim=0)

    joined = {
        f.name: join([getattr(b, f.name) for b in batches])
        for f in fields(TrainBatch)
        if f.name != "extras"
    }
    keys = set(batches[0].extras)
    if any(set(b.extras) != keys for b in batches):
        raise ValueError("micro-batches carry different extras")
    extras = {key: join([b.extras[key] for b in batches]) for key in sorted(keys)}
    return TrainBatch(**joined, extras=extras)


def _take(tensor: torch.Tensor | None, rows: torch.Tensor, seq: int, width: int):
    if tensor is None:
        return None
    picked = tensor.index_select(0, rows.to(tensor.device))
    offset = _seq_offset(picked, seq)
    return picked if offset is None else picked[:, : width - offset].contiguous()


def regroup(batches: Sequence[TrainBatch], groups: Sequence[Sequence[int]]) -> list[TrainBatch]:
    """New micro-batches holding the given rows (indices into the concatenated `batches`),
    each trimmed to its longest row."""
    import torch

    whole = _concat(batches)
    seq = whole.input_ids.shape[1]
    lengths = row_lengths(whole)
    out = []
    for group in groups:
        rows = torch.tensor(list(group), dtype=torch.long)
        width = max(lengths[i] for i in group)
        extras = {k: _take(v, rows, seq, width) for k, v in whole.extras.items()}
        values = {
            f.name: _take(getattr(whole, f.name), rows, seq, width)
            for f in fields(TrainBatch)
            if f.name != "extras"
        }
        out.append(replace(whole, **values, extras=extras))
    return out


def pad_batch(batch: TrainBatch, multiple: int) -> TrainBatch:
    """Right-pad every sequence dimension so the length is a multiple of `multiple` (sequence
    parallelism needs TP | S; context parallelism needs 2*CP | S)."""
    seq = batch.input_ids.shape[1]
    width = round_up(seq, multiple)
    if width == seq:
        return batch

    def pad(tensor: torch.Tensor | None) -> torch.Tensor | None:
        offset = _seq_offset(tensor, seq)
        return tensor if offset is None else _pad_to(tensor, width - offset)

    values = {f.name: pad(getattr(batch, f.name)) for f in fields(TrainBatch) if f.name != "extras"}
    return replace(batch, **values, extras={k: pad(v) for k, v in batch.extras.items()})


def context_parallel_positions(seq_len: int, cp_size: int, cp_rank: int) -> list[int]:
    """Positions of a sequence that context-parallel rank `cp_rank` holds.

    Megatron's load-balanced layout (``get_batch_on_this_cp_rank``): the sequence is cut into
    ``2 * cp_size`` chunks and rank r keeps chunks r and ``2 * cp_size - 1 - r``.
    """
    chunks = 2 * cp_size
    if seq_len % chunks:
        raise ValueError(f"sequence length {seq_len} is not divisible by 2 x CP ({chunks})")
    size = seq_len // chunks
    first, second = cp_rank, chunks - 1 - cp_rank
    return [*range(first * size, (first + 1) * size), *range(second * size, (second + 1) * size)]


def context_parallel_order(seq_len: int, cp_size: int) -> list[int]:
    """Concatenating every rank's `context_parallel_positions` in rank order lists these
    positions; ``argsort`` of it restores sequence order."""
    return [
        p for rank in range(cp_size) for p in context_parallel_positions(seq_len, cp_size, rank)
    ]
