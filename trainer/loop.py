"""The GRPO loop, independent of Ray and of the backends.

Each rollout: sample prompts -> generate `n` responses each -> rewards -> group advantages ->
log-probabilities of the policy (old) and, with ``--use-kl-loss``, of the reference (adapter
disabled) -> optimizer steps over ``--global-batch-size`` samples, split over the data-parallel
ranks and into micro-batches -> export the adapter, which reaches the rollout engines in memory
before they generate again -> eval every ``--eval-interval`` -> checkpoint every
``--save-interval`` and at the end.

The loop drives a `TrainerGroup` (data-parallel ranks) and the rollout engines behind one
`RolloutEngine`; `trainer.placement` provides them as Ray actors. With ``--colocate`` the two
take turns on the devices through `trainer.backends.colocate.Colocation`.

Work left out: the reference forward runs only with ``--use-kl-loss``; micro-batches are
length-bucketed, so they carry little padding.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer import adapter_check, checkpoint
from trainer.arguments import UsageError
from trainer.backends.base import (
    ForwardOutput,
    Generation,
    LoraAdapter,
    LossFn,
    RolloutEngine,
    SamplingParams,
    StepResult,
    TrainBatch,
)
from trainer.backends.colocate import Colocation, Phase
from trainer.data import RolloutDataSource, Sample, num_rollouts_for_epochs
from trainer.grpo import (
    GRPOConfig,
    Normalizer,
    group_advantages,
    grpo_loss,
    overlong_penalty,
    whiten,
)
from trainer.metrics import MetricsLogger
from trainer.rewards import (
    RewardSample,
    call_custom_rewards,
    get_reward,
    load_function,
    reward_value,
)
from trainer.sampling_filters import keeps

Shards = Sequence[Sequence[TrainBatch]]  # per data-parallel rank, its micro-batches


class TrainerGroup(Protocol):
    """`world_size` data-parallel ranks of one policy; ``shards[i]`` goes to rank i, and the
    results come back in rank order."""

    world_size: int

    def forward(self, shards: Shards, *, with_adapter: bool) -> list[list[ForwardOutput]]: ...

    def train_step(self, shards: Shards, loss_fn: LossFn) -> list[StepResult]: ...

    def export_adapter(self) -> LoraAdapter: ...

    def adapter_digests(self) -> list[str]:
        """`trainer.backends.base.adapter_digest` of every rank's adapter, in rank order."""
        ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...

    def release_memory(self) -> None: ...

    def resume_memory(self) -> None: ...


class Tokenizer(Protocol):
    pad_token_id: int | None
    eos_token_id: int | None

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, ids: Sequence[int], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class GRPOLoss:
    """The `LossFn` of one optimizer step (picklable: it travels to the training actors)."""

    config: GRPOConfig
    normalizer: Normalizer

    def __call__(
        self, out: ForwardOutput, batch: TrainBatch
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return grpo_loss(
            out.logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.loss_mask,
            self.config,
            ref_logprobs=batch.ref_logprobs,
            entropy=out.entropy,
            normalizer=self.normalizer,
            rollout_logprobs=batch.rollout_logprobs,
        )


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


def num_rollouts(args: argparse.Namespace, num_prompts: int) -> int:
    if args.num_rollout is not None:
        return args.num_rollout
    return num_rollouts_for_epochs(num_prompts, args.rollout_batch_size, args.num_epoch)


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"time/{name}"] = self.times.get(f"time/{name}", 0.0) + (
                time.perf_counter() - start
            )


class GRPOLoop:
    def __init__(
        self,
        args: argparse.Namespace,
        *,
        trainers: TrainerGroup,
        engines: RolloutEngine,
        tokenizer: Tokenizer,
        source: RolloutDataSource,
        eval_sets: Mapping[str, Sequence[Sample]],
        logger_factory: Callable[[int, int], MetricsLogger],
        colocation: Colocation | None = None,
    ) -> None:
        """`colocation`: the trainers and engines as started (`Colocation.start_engines_first`);
        by default both are taken as built and the engines release their memory on `run`."""
        self.args = args
        self.trainers = trainers
        self.engines = engines
        self.tokenizer = tokenizer
        self.source = source
        self.eval_sets = dict(eval_sets)
        self.logger_factory = logger_factory
        self.reward_fn = get_reward(args.rm_type)
        self.custom_rm = _user_function(args.custom_rm_path)
        self.sampling_filter = _user_function(args.dynamic_sampling_filter_path)
        self.config = GRPOConfig.from_args(args)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.num_rollout = num_rollouts(args, len(source))
        self.start = 0
        self.colocation = colocation or Colocation(trainers, engines, colocate=args.colocate)
        self.pending: LoraAdapter | None = None
        self.saved: Path | None = None
        self._prompt_ids: dict[str, list[int]] = {}
        self.sync_probe: TrainBatch | None = None  # --check-adapter-sync's fixed sequence
        self.sync_expected: torch.Tensor | None = None  # the trainer's log-probs of it

    # ------------------------------------------------------------------ resume / save

    def restore(self) -> int:
        """Resume from ``--load``'s latest checkpoint (if any); returns the first rollout to run."""
        root = Path(self.args.load) if self.args.load else None
        iteration = checkpoint.latest_iteration(root)
        if root is None or iteration is None:
            return self.start
        path = checkpoint.iter_dir(root, iteration)
        state = checkpoint.load_state(root, iteration)
        self.source.load_state_dict(state["data"])
        self.trainers.load(path)
        self.start = int(state["rollout_index"])
        self.pending = self.trainers.export_adapter()
        self.saved = path / checkpoint.ADAPTER_DIR
        print(f"resumed from {path} (next rollout {self.start + 1}/{self.num_rollout})", flush=True)
        return self.start

    def save(self, rollout_index: int) -> Path:
        """A checkpoint under ``--save`` (or, without it, the adapter in <output-dir>/final)."""
        if self.args.save:
            state = {
                "rollout_index": rollout_index,
                "data": self.source.state_dict(),
                "seed": self.args.seed,
            }
            path = checkpoint.save(Path(self.args.save), rollout_index, self.save_trainers, state)
        else:
            path = Path(self.args.output_dir) / "final"
            self.save_trainers(path)
        self.saved = path / checkpoint.ADAPTER_DIR
        return path

    def save_trainers(self, path: Path) -> None:
        """The trainers' files, and with the sync check the adapter's `adapter_check` file."""
        self.trainers.save(path)
        if self.sync_probe is not None and self.sync_expected is not None:
            response = self.sync_probe.loss_mask[0] > 0
            check = adapter_check.LogprobCheck(
                input_ids=self.sync_probe.input_ids[0].tolist(),
                response=response.tolist(),
                logprobs=self.sync_expected.tolist(),
                # the trainers' log_softmax(logits / T), as the engines define it
                temperature=self.args.rollout_temperature or 1.0,
            )
            adapter_check.write(path / checkpoint.ADAPTER_DIR, check)

    def due(self, interval: int | None, rollout_id: int) -> bool:
        return bool(interval) and (rollout_id + 1) % interval == 0

    # ------------------------------------------------------------------ the loop

    def run(self) -> Path | None:
        if self.colocation.phase is Phase.SETUP:
            self.colocation.start()
        logger = self.logger_factory(self.start, self.num_rollout)
        try:
            for rollout_id in range(self.start, self.num_rollout):
                logger.log(rollout_id, self.step(rollout_id))
                last = rollout_id + 1 == self.num_rollout
                if self.due(self.args.save_interval, rollout_id) or last:
                    started = time.perf_counter()
                    path = self.save(rollout_id + 1)
                    print(f"saved {path} ({time.perf_counter() - started:.1f} s)", flush=True)
        finally:
            logger.close()
        return self.saved

    def step(self, rollout_id: int) -> dict[str, float]:
        timer = Timer()
        with timer("step"):
            generations, rewards, sampling = self.collect(rollout_id, timer)
            metrics = rollout_metrics(generations, rewards, self.args.n_samples_per_prompt)
            metrics.update(sampling)
            lengths = torch.tensor([len(g.response_ids) for g in generations])
            if self.args.overlong_buffer_len:
                penalty = overlong_penalty(
                    lengths,
                    self.args.rollout_max_response_len,
                    self.args.overlong_buffer_len,
                    self.args.overlong_penalty_factor,
                )
                rewards = rewards + penalty
                metrics["rollout/overlong_penalty_mean"] = float(penalty.mean())
            advantages = group_advantages(
                rewards, self.args.n_samples_per_prompt, self.args.grpo_std_normalization
            )
            if self.args.normalize_advantages:
                # a sample weighs by its loss tokens: none for a truncated one under the filter
                dropped = torch.tensor(
                    [g.truncated and self.args.overlong_filter for g in generations]
                )
                weights = lengths.masked_fill(dropped, 0)
                if weights.sum() > 0:
                    advantages = whiten(advantages, weights)
            metrics.update(self.train(generations, advantages, timer))
            if self.args.check_adapter_sync:
                metrics.update(self.expect_adapter_sync(generations[0]))
            with timer("export_adapter"):
                self.pending = self.trainers.export_adapter()
            last = rollout_id + 1 == self.num_rollout
            if self.eval_sets and (self.due(self.args.eval_interval, rollout_id) or last):
                with timer("eval"):
                    metrics.update(self.evaluate(rollout_id, timer))
        return {**metrics, **timer.times}

    def collect(
        self, rollout_id: int, timer: Timer
    ) -> tuple[list[Generation], torch.Tensor, dict[str, float]]:
        """``--rollout-batch-size`` groups with their rewards. With a dynamic-sampling filter
        (DAPO), rounds of ``--over-sampling-batch-size`` prompts are generated and the groups
        the filter rejects dropped, until enough are kept; after one epoch's worth of prompts
        without enough, rejected groups fill the rest (miles would wait for ever)."""
        args, n = self.args, self.args.n_samples_per_prompt
        target = args.rollout_batch_size
        kept: list[tuple[list[Generation], torch.Tensor]] = []
        rejected: list[tuple[list[Generation], torch.Tensor]] = []
        rounds = prompts = 0
        with self.colocation.rollout(timer):  # one phase for every round: the GPUs swap once
            self.publish(timer)
            checked = self.check_adapter_sync()
            while len(kept) < target:
                if self.sampling_filter is not None and prompts >= max(len(self.source), target):
                    kept.extend(rejected[: target - len(kept)])
                    break
                size = args.over_sampling_batch_size if self.sampling_filter else target
                samples = self.source.next_batch(size)
                with timer("rollout"):
                    generations = self.generate(
                        samples, rollout_id, evaluation=False, attempt=rounds
                    )
                with timer("reward"):
                    rewards = self.rewards(samples, generations, n)
                for i, sample in enumerate(samples):
                    group = (generations[i * n : (i + 1) * n], rewards[i * n : (i + 1) * n])
                    keep = self.sampling_filter is None or keeps(
                        self.sampling_filter(args, self.graded(sample, *group))
                    )
                    (kept if keep else rejected).append(group)
                rounds += 1
                prompts += size
        kept = kept[:target]
        generations = [g for group, _ in kept for g in group]
        rewards = torch.cat([r for _, r in kept])
        if self.sampling_filter is None:
            return generations, rewards, checked
        return (
            generations,
            rewards,
            {
                **checked,
                "rollout/dynamic_sampling_rounds": float(rounds),
                "rollout/dynamic_sampling_dropped": float(len(rejected)),
            },
        )

    def graded(
        self, sample: Sample, generations: Sequence[Generation], rewards: torch.Tensor
    ) -> list[RewardSample]:
        return [
            RewardSample(sample.prompt, self.decode(g), sample.label, dict(sample.metadata), r)
            for g, r in zip(generations, rewards.tolist(), strict=True)
        ]

    def decode(self, generation: Generation) -> str:
        return self.tokenizer.decode(generation.response_ids, skip_special_tokens=True)

    def publish(self, timer: Timer) -> None:
        if self.pending is not None:
            with timer("load_adapter"):
                self.engines.load_adapter(self.pending)
            self.pending = None

    def expect_adapter_sync(self, first: Generation) -> dict[str, float]:
        """The trainer's log-probs of the fixed sequence (the first rollout's first sample)
        after this update, which the engines must reproduce once they load the new adapter;
        `sync/adapter_shift` (with vs without the adapter) shows the comparison can fail, and
        `sync/ranks_off_rank0_adapter` counts data-parallel ranks whose adapter differs."""
        if self.sync_probe is None:
            self.sync_probe = pack([first], [0.0], self.pad_id)
        shards = [[self.sync_probe]] * self.trainers.world_size
        [with_adapter] = self.trainers.forward(shards, with_adapter=True)[0]
        [without] = self.trainers.forward(shards, with_adapter=False)[0]
        response = self.sync_probe.loss_mask[0] > 0  # the tokens a trainer scores
        self.sync_expected = with_adapter.logprobs[0][response]
        shift = (with_adapter.logprobs[0] - without.logprobs[0])[response].abs().mean()
        digests = self.trainers.adapter_digests()
        return {
            "sync/adapter_shift": float(shift),
            "sync/ranks_off_rank0_adapter": float(sum(d != digests[0] for d in digests)),
        }

    def check_adapter_sync(self) -> dict[str, float]:
        """Worst mean |engine - trainer| log-prob over the engines, on the fixed sequence's
        response tokens, right after the engines loaded the trainer's latest adapter."""
        if self.sync_probe is None or self.sync_expected is None:
            return {}
        served = self.engines.score(self.sync_probe.input_ids[0].tolist())
        response = self.sync_probe.loss_mask[0] > 0
        worst = max(
            float((torch.tensor(scores)[response] - self.sync_expected).abs().mean())
            for scores in served
        )
        return {"sync/engine_trainer_logprob_abs_diff": worst}

    def prompt_ids(self, sample: Sample) -> list[int]:
        if sample.prompt not in self._prompt_ids:
            ids = self.tokenizer.encode(sample.prompt, add_special_tokens=False)
            self._prompt_ids[sample.prompt] = list(ids)
        return self._prompt_ids[sample.prompt]

    def generate(
        self, samples: Sequence[Sample], rollout_id: int, *, evaluation: bool, attempt: int = 0
    ) -> list[Generation]:
        """`n` responses per sample, sampling seeded by (seed, rollout, round): a resumed run
        samples what the uninterrupted run would have."""
        args = self.args
        if evaluation:
            n, length = args.n_samples_per_eval_prompt, args.eval_max_response_len
            temperature, top_p, salt = args.eval_temperature, args.eval_top_p, "eval"
        else:
            n, length = args.n_samples_per_prompt, args.rollout_max_response_len
            temperature, top_p, salt = args.rollout_temperature, args.rollout_top_p, "rollout"
        params = SamplingParams(
            max_new_tokens=length,
            temperature=temperature,
            top_p=top_p,
            top_k=args.rollout_top_k,
            seed=call_seed(args.seed, salt, rollout_id, attempt),
            stop_token_ids=tuple(args.rollout_stop_token_ids or ()),
            stop=tuple(args.rollout_stop or ()),
        )
        prompts = [self.prompt_ids(s) for s in samples for _ in range(n)]
        return self.engines.generate(prompts, params)

    def rewards(
        self, samples: Sequence[Sample], generations: Sequence[Generation], n: int
    ) -> torch.Tensor:
        repeated = [s for s in samples for _ in range(n)]
        if self.custom_rm is None:
            raw = [
                self.reward_fn(self.decode(g), sample.label)
                for g, sample in zip(generations, repeated, strict=True)
            ]
        else:
            graded = [
                RewardSample(sample.prompt, self.decode(g), sample.label, dict(sample.metadata))
                for g, sample in zip(generations, repeated, strict=True)
            ]
            raw = call_custom_rewards(self.custom_rm, self.args, graded)
        try:
            values = [reward_value(value, self.args.reward_key) for value in raw]
        except ValueError as err:
            raise UsageError(str(err)) from None
        return torch.tensor(values, dtype=torch.float32)

    def train(
        self, generations: Sequence[Generation], advantages: torch.Tensor, timer: Timer
    ) -> dict[str, float]:
        steps = self.micro_batches(generations, advantages)
        world = self.trainers.world_size
        with timer("logprobs"):
            self.attach_logprobs(steps)
        results: list[dict[str, float]] = []
        with timer("train"):
            for step in steps:
                counts = Normalizer.from_masks(mb.loss_mask for rank in step for mb in rank)
                normalizer = replace(
                    counts, tokens=counts.tokens / world, sequences=counts.sequences / world
                )
                loss_fn = GRPOLoss(self.config, normalizer)
                results.append(average_results(self.trainers.train_step(step, loss_fn)))
        return {f"train/{k}": sum(r[k] for r in results) / len(results) for k in results[0]}

    def micro_batches(
        self, generations: Sequence[Generation], advantages: torch.Tensor
    ) -> list[list[list[TrainBatch]]]:
        """Packed micro-batches as [optimizer step][rank][micro-batch]."""
        plan = schedule(
            [len(g.prompt_ids) + len(g.response_ids) for g in generations],
            global_batch=self.args.global_batch_size,
            world_size=self.trainers.world_size,
            micro_batch=self.args.micro_batch_size,
            balance=self.args.balance_data,
        )
        return [
            [
                [
                    pack(
                        [generations[i] for i in mb],
                        advantages[mb].tolist(),
                        self.pad_id,
                        drop_truncated=self.args.overlong_filter,
                    )
                    for mb in rank
                ]
                for rank in step
            ]
            for step in plan
        ]

    def attach_logprobs(self, steps: list[list[list[TrainBatch]]]) -> None:
        """Set old (policy) and, with ``--use-kl-loss``, reference (adapter disabled)
        log-probabilities on every micro-batch, before any optimizer step.

        With one optimizer step per rollout the old policy is the one being trained, unchanged
        since it generated: its log-probabilities are the training forward's own (`grpo_loss`
        takes them from there, as TRL does), so the extra forward is skipped. The reference
        forward costs as much and only the KL term reads it: it runs with ``--use-kl-loss``
        (with ``--kl-loss-coef 0`` for the KL metric alone, as in miles)."""
        world = self.trainers.world_size
        shards = [[mb for step in steps for mb in step[rank]] for rank in range(world)]
        none = [[None] * len(shard) for shard in shards]
        old = self.trainers.forward(shards, with_adapter=True) if len(steps) > 1 else none
        ref = self.trainers.forward(shards, with_adapter=False) if self.config.use_kl_loss else none
        for shard, old_out, ref_out in zip(shards, old, ref, strict=True):
            for mb, o, f in zip(shard, old_out, ref_out, strict=True):
                mb.old_logprobs = None if o is None else o.logprobs
                mb.ref_logprobs = None if f is None else f.logprobs

    def evaluate(self, rollout_id: int, timer: Timer) -> dict[str, float]:
        scores = {}
        with self.colocation.rollout(timer):
            self.publish(timer)
            for name, samples in self.eval_sets.items():
                generations = self.generate(samples, rollout_id, evaluation=True)
                rewards = self.rewards(samples, generations, self.args.n_samples_per_eval_prompt)
                scores[f"eval/{name}"] = float(rewards.mean())
        return scores


def _user_function(path: str | None) -> Callable[..., Any] | None:
    """A ``module.function`` named on the command line; an unusable one is a usage error."""
    if path is None:
        return None
    try:
        return load_function(path)
    except ValueError as err:
        raise UsageError(str(err)) from None


def call_seed(seed: int, purpose: str, rollout_id: int, attempt: int) -> int:
    """The seed of one generate call, a 40-bit hash of what it is for: distinct calls get
    unrelated seeds (room for `SamplingParams.request_seed`'s request index), and a resumed run
    gets the seeds the uninterrupted run had."""
    key = f"{seed}/{purpose}/{rollout_id}/{attempt}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:5], "big")


def average_results(results: Sequence[StepResult]) -> dict[str, float]:
    """Metrics averaged over ranks (each rank's are its share of the step's value)."""
    keys = results[0].metrics.keys()
    averaged = {k: sum(r.metrics[k] for r in results) / len(results) for k in keys}
    averaged["grad_norm"] = results[0].grad_norm
    return averaged


def rollout_metrics(
    generations: Sequence[Generation], rewards: torch.Tensor, group_size: int
) -> dict[str, float]:
    lengths = torch.tensor([len(g.response_ids) for g in generations], dtype=torch.float32)
    groups = rewards.view(-1, group_size)
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "rollout/response_len_mean": float(lengths.mean()),
        "rollout/response_len_max": float(lengths.max()),
        "rollout/truncated_ratio": sum(g.truncated for g in generations) / len(generations),
        "rollout/zero_std_group_ratio": float((groups.std(dim=1) == 0).float().mean())
        if group_size > 1
        else 1.0,
    }
