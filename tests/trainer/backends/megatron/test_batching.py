"""Dynamic batching by token budget, micro-batch regrouping and context-parallel slicing."""

from __future__ import annotations

import sys

import pytest
import torch

from trainer.backends.base import TrainBatch
from trainer.backends.megatron.batching import (
    context_parallel_order,
    context_parallel_positions,
    pack_by_token_budget,
    pad_batch,
    regroup,
    row_lengths,
)


def _cost(group: list[int], lengths: list[int]) -> int:
    return len(group) * max(lengths[i] for i in group)


def test_pack_respects_budget_and_covers_every_row_once() -> None:
    lengths = [5, 17, 3, 9, 9, 30, 1, 12, 8, 8]
    groups = pack_by_token_budget(lengths, 32)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(_cost(g, lengths) <= 32 for g in groups)
    assert groups == [[5], [1], [3, 7], [4, 8, 9], [0, 2, 6]]


def test_pack_gives_an_overlong_row_its_own_group() -> None:
    assert pack_by_token_budget([50, 4, 4], 16) == [[0], [1, 2]]


def test_pack_reaches_min_groups_by_halving_the_largest() -> None:
    groups = pack_by_token_budget([4] * 8, 100, min_groups=3)
    assert len(groups) == 3
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert pack_by_token_budget([4, 4], 100, min_groups=5) == [[0], [1]]


def test_pack_rejects_a_non_positive_budget() -> None:
    with pytest.raises(ValueError, match="max_tokens must be > 0"):
        pack_by_token_budget([1], 0)


def _batch(lengths: list[int], width: int, base: int) -> TrainBatch:
    rows = len(lengths)
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.arange(n) + 100 * (base + r)
        mask[r, :n] = 1
    token = ids[:, 1:].float()
    return TrainBatch(
        input_ids=ids,
        attention_mask=mask,
        loss_mask=mask[:, 1:].clone(),
        advantages=torch.arange(rows, dtype=torch.float32) + base,
        old_logprobs=token,
        extras={"row_weight": torch.ones(rows) * base},
    )


def test_regroup_moves_whole_rows_and_trims_padding() -> None:
    first = _batch([3, 6], width=6, base=0)
    second = _batch([2], width=4, base=2)
    assert row_lengths(first) == [3, 6]
    out = regroup([first, second], [[2, 0], [1]])
    short, long_ = out
    assert short.input_ids.tolist() == [[200, 201, 0], [0, 1, 2]]
    assert short.old_logprobs.shape == (2, 2)
    assert short.loss_mask.tolist() == [[1, 0], [1, 1]]
    assert short.advantages.tolist() == [2.0, 0.0]
    assert short.extras["row_weight"].tolist() == [2.0, 0.0]
    assert long_.input_ids.tolist() == [[100, 101, 102, 103, 104, 105]]
    assert long_.old_logprobs.tolist() == [[101.0, 102.0, 103.0, 104.0, 105.0]]
    assert short.ref_logprobs is None


def test_regroup_rejects_inconsistent_micro_batches() -> None:
    first = _batch([2], width=3, base=0)
    second = _batch([2], width=3, base=1)
    second.old_logprobs = None
    with pytest.raises(ValueError, match="set in some micro-batches"):
        regroup([first, second], [[0, 1]])


def test_pad_batch_pads_positions_and_tokens() -> None:
    padded = pad_batch(_batch([3], width=5, base=0), 4)
    assert padded.input_ids.shape == (1, 8)
    assert padded.old_logprobs.shape == (1, 7)
    assert padded.advantages.shape == (1,)
    assert pad_batch(padded, 4) is padded


def test_context_parallel_layout_matches_megatron_load_balancing() -> None:
    assert context_parallel_positions(8, 2, 0) == [0, 1, 6, 7]
    assert context_parallel_positions(8, 2, 1) == [2, 3, 4, 5]
    order = context_parallel_order(12, 3)
    assert sorted(order) == list(range(12))
    restored = torch.tensor(order).argsort()
    assert torch.equal(torch.tensor(order)[restored], torch.arange(12))
    with pytest.raises(ValueError, match="not divisible by 2 x CP"):
        context_parallel_positions(6, 2, 0)


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
