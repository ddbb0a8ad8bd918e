"""The adapter-sync probe (``--check-adapter-sync``): do the engines serve the trainer's adapter?

After each update the trainers score one fixed sequence (the first rollout's first sample) with
the new adapter (`AdapterSyncProbe.expect`); once the engines have loaded that adapter they score
it too (`AdapterSyncProbe.check`): the worst mean |engine - trainer| log-prob over the engines is
``sync/engine_trainer_logprob_abs_diff``. At each save the expectation goes beside the adapter
(`trainer.run.adapter_check`), so whoever loads it elsewhere can check it reproduces the policy; a
resumed run takes it back (`AdapterSyncProbe.restore`), so its first rollout checks that the
engines serve the adapter it resumed from.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainer.backends.base import Generation, RolloutEngine, TrainBatch, TrainerGroup
from trainer.batching import pack
from trainer.run import adapter_check


class AdapterSyncProbe:
    def __init__(self, pad_id: int, temperature: float) -> None:
        """`temperature`: the rollout's, with which the trainers compute log-probs."""
        self.pad_id = pad_id
        self.temperature = temperature or 1.0
        self.sequence: TrainBatch | None = None  # the fixed sequence
        self.expected: torch.Tensor | None = None  # the trainers' log-probs of its response

    def expect(self, trainers: TrainerGroup, first: Generation) -> dict[str, float]:
        """The trainers' log-probs of the fixed sequence after this update, which the engines
        must reproduce once they load the new adapter; `sync/adapter_shift` (with vs without
        the adapter) shows the comparison can fail, and `sync/ranks_off_rank0_adapter` counts
        data-parallel ranks whose adapter differs."""
        if self.sequence is None:
            self.sequence = pack([first], [0.0], self.pad_id)
        shards = [[self.sequence]] * trainers.world_size
        [with_adapter] = trainers.forward(shards, with_adapter=True)[0]
        [without] = trainers.forward(shards, with_adapter=False)[0]
        response = _scored(self.sequence)
        self.expected = with_adapter.logprobs[0][response]
        shift = (with_adapter.logprobs[0] - without.logprobs[0])[response].abs().mean()
        digests = trainers.adapter_digests()
        return {
            "sync/adapter_shift": float(shift),
            "sync/ranks_off_rank0_adapter": float(sum(d != digests[0] for d in digests)),
        }

    def check(self, engines: RolloutEngine) -> dict[str, float]:
        """Worst mean |engine - trainer| log-prob over the engines, on the fixed sequence's
        response tokens, right after the engines loaded the trainer's latest adapter."""
        if self.sequence is None or self.expected is None:
            return {}
        served = engines.score(self.sequence.input_ids[0].tolist())
        response = _scored(self.sequence)
        worst = max(
            float((torch.tensor(scores)[response] - self.expected).abs().mean())
            for scores in served
        )
        return {"sync/engine_trainer_logprob_abs_diff": worst}

    def restore(self, adapter_dir: Path) -> None:
        """The expectation saved beside a checkpoint's adapter (none when that run did not
        check, or had not updated yet)."""
        if not (adapter_dir / adapter_check.CHECK_FILE).is_file():
            return
        saved = adapter_check.read(adapter_dir)
        input_ids = torch.tensor([saved.input_ids])
        self.sequence = TrainBatch(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            loss_mask=torch.tensor([saved.response], dtype=torch.float32),
        )
        self.expected = torch.tensor(saved.logprobs)

    def write(self, adapter_dir: Path) -> None:
        """The expectation beside a saved adapter (nothing before the first update)."""
        if self.sequence is None or self.expected is None:
            return
        check = adapter_check.LogprobCheck(
            input_ids=self.sequence.input_ids[0].tolist(),
            response=_scored(self.sequence).tolist(),
            logprobs=self.expected.tolist(),
            # the trainers' log_softmax(logits / T), as the engines define it
            temperature=self.temperature,
        )
        adapter_check.write(adapter_dir, check)


def _scored(sequence: TrainBatch) -> torch.Tensor:
    """Which positions of `sequence` a trainer scores (its response tokens)."""
    return sequence.loss_mask[0] > 0
