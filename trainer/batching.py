"""A rollout's training batches: generations packed into padded rows, scheduled over optimizer
steps, data-parallel ranks and micro-batches.

Each optimizer step takes the next ``--global-batch-size`` samples, an equal share per rank
(with ``--balance-data``, longest first to the rank with the fewest tokens so far); a rank's
share is cut into ``--micro-batch-size`` micro-batches of similar lengths (`bucketed`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trainer.backends.base import Generation, TrainBatch
from trainer.config import BatchConfig

Steps = list[list[list[TrainBatch]]]  # [optimizer step][rank][micro-batch]


def pack(
    generations: Sequence[Generation],
    advantages: Sequence[float],
    pad_id: int,
    drop_truncated: bool = False,
) -> TrainBatch:
    """Right-padded prompt+response rows; per-token tensors align with ``input_ids[:, 1:]``.
    With `drop_truncated` (DAPO overlong filtering) a truncated response has no loss tokens."""
    width = max(len(g.prompt_ids) + len(g.response_ids) for g in generations)
    rows = len(generations)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width - 1), dtype=torch.float32)
    rollout_logprobs = torch.zeros((rows, width - 1), dtype=torch.float32)
    for row, g in enumerate(generations):
        prompt, response = len(g.prompt_ids), len(g.response_ids)
        input_ids[row, : prompt + response] = torch.tensor(
            [*g.prompt_ids, *g.response_ids], dtype=torch.long
        )
        attention_mask[row, : prompt + response] = 1
        if not (drop_truncated and g.truncated):
            loss_mask[row, prompt - 1 : prompt - 1 + response] = 1.0
        rollout_logprobs[row, prompt - 1 : prompt - 1 + response] = torch.tensor(
            g.response_logprobs, dtype=torch.float32
        )
    advantage = torch.tensor(list(advantages), dtype=torch.float32).unsqueeze(-1)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        advantages=advantage * loss_mask,
        rollout_logprobs=rollout_logprobs,
    )


def schedule(
    lengths: Sequence[int],
    *,
    global_batch: int,
    world_size: int,
    micro_batch: int,
    balance: bool = False,
) -> list[list[list[list[int]]]]:
    """Sample indices as [optimizer step][rank][micro-batch][sample].

    Each step takes the next `global_batch` samples, `global_batch / world_size` per rank. With
    `balance`, a step's samples go longest first to the rank with the fewest tokens so far.
    A rank's micro-batches are length-bucketed (see `bucketed`).
    """
    per_rank = global_batch // world_size
    steps = []
    for start in range(0, len(lengths), global_batch):
        indices = list(range(start, start + global_batch))
        if balance:
            ranks: list[list[int]] = [[] for _ in range(world_size)]
            tokens = [0] * world_size
            for index in sorted(indices, key=lambda i: -lengths[i]):
                open_ranks = [r for r in range(world_size) if len(ranks[r]) < per_rank]
                rank = min(open_ranks, key=lambda r: tokens[r])
                ranks[rank].append(index)
                tokens[rank] += lengths[index]
            ranks = [sorted(r) for r in ranks]
        else:
            ranks = [indices[r * per_rank : (r + 1) * per_rank] for r in range(world_size)]
        steps.append([bucketed(r, lengths, micro_batch) for r in ranks])
    return steps


def bucketed(indices: Sequence[int], lengths: Sequence[int], size: int) -> list[list[int]]:
    """`indices` in micro-batches of `size`, longest first. A micro-batch pads to its longest
    sample, so samples of similar length together waste the least compute on padding; the
    step's loss and gradient are sums over its micro-batches with the step's normalizer, so the
    grouping changes nothing else."""
    ordered = sorted(indices, key=lambda i: -lengths[i]) if size > 1 else list(indices)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def micro_batches(
    generations: Sequence[Generation],
    advantages: torch.Tensor,
    batch: BatchConfig,
    *,
    world_size: int,
    pad_id: int,
    drop_truncated: bool = False,
) -> Steps:
    """The rollout's packed micro-batches as [optimizer step][rank][micro-batch]."""
    plan = schedule(
        [len(g.prompt_ids) + len(g.response_ids) for g in generations],
        global_batch=batch.global_batch_size,
        world_size=world_size,
        micro_batch=batch.micro_batch_size,
        balance=batch.balance_data,
    )
    return [
        [
            [
                pack(
                    [generations[i] for i in mb],
                    advantages[mb].tolist(),
                    pad_id,
                    drop_truncated=drop_truncated,
                )
                for mb in rank
            ]
            for rank in step
        ]
        for step in plan
    ]
