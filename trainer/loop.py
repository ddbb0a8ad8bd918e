"""The GRPO loop, independent of Ray and of the backends.

Each rollout: sample prompts -> generate `n` responses each -> rewards -> advantages (the
estimator ``--advantage-estimator`` names, `trainer.grpo.advantages`) -> log-probabilities of the
policy (old) and, with ``--use-kl-loss``, of the reference (adapter disabled) -> optimizer steps
over ``--global-batch-size`` samples, split over the data-parallel ranks and into micro-batches
(`trainer.batching`) -> export the adapter, which reaches the rollout engines in memory before
they generate again (checked with ``--check-adapter-sync``, `trainer.adapter_sync`) -> eval every
``--eval-interval`` -> checkpoint every ``--save-interval`` and at the end.

The loop drives a `TrainerGroup` (data-parallel ranks) and the rollout engines behind one
`RolloutEngine`; `trainer.job.placement` provides them as Ray actors. With ``--colocate`` the two
take turns on the devices through `trainer.backends.colocate.Colocation`.

Work left out: the reference forward runs only with ``--use-kl-loss``; micro-batches are
length-bucketed, so they carry little padding.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.adapter_sync import AdapterSyncProbe
from trainer.backends.base import (
    ForwardOutput,
    Generation,
    LoraAdapter,
    RolloutEngine,
    SamplingParams,
    StepResult,
    TrainBatch,
    TrainerGroup,
)
from trainer.backends.colocate import Colocation, Phase
from trainer.batching import Steps, micro_batches
from trainer.config import TrainConfig
from trainer.errors import UsageError
from trainer.grpo.filters import keeps
from trainer.grpo.loss import GRPOConfig, Normalizer, grpo_loss
from trainer.grpo.rewards import (
    RewardSample,
    call_custom_rewards,
    get_reward,
    load_function,
    reward_value,
)
from trainer.run import checkpoint
from trainer.run.data import RolloutDataSource, Sample, num_rollouts
from trainer.run.metrics import MetricsLogger

# entered with each timed phase of a step, given its name
PhaseObserver = Callable[[str], AbstractContextManager[None]]


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
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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


class Timer:
    """Each named phase's seconds (``time/NAME``, summed over its entries); `observe`, where
    given, is entered with each phase too (a benchmark's memory sampler, say)."""

    def __init__(self, observe: PhaseObserver | None = None) -> None:
        self.times: dict[str, float] = {}
        self.observe = observe

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            with self.observe(name) if self.observe is not None else nullcontext():
                yield
        finally:
            self.times[f"time/{name}"] = self.times.get(f"time/{name}", 0.0) + (
                time.perf_counter() - start
            )


class GRPOLoop:
    def __init__(
        self,
        config: TrainConfig,
        *,
        trainers: TrainerGroup,
        engines: RolloutEngine,
        tokenizer: Tokenizer,
        source: RolloutDataSource,
        eval_sets: Mapping[str, Sequence[Sample]],
        logger_factory: Callable[[int, int], MetricsLogger],
        colocation: Colocation | None = None,
        observe_phase: PhaseObserver | None = None,
    ) -> None:
        """`colocation`: the trainers and engines as started (`Colocation.start_engines_first`);
        by default both are taken as built and the engines release their memory on `run`.
        `observe_phase`: entered with each timed phase of a step (`Timer`)."""
        self.config = config
        self.observe_phase = observe_phase
        self.trainers = trainers
        self.engines = engines
        self.tokenizer = tokenizer
        self.source = source
        self.eval_sets = dict(eval_sets)
        self.logger_factory = logger_factory
        self.reward_fn = get_reward(config.reward.rm_type)
        self.custom_rm = _user_function(config.reward.custom_rm_path)
        self.sampling_filter = _user_function(config.rollout.dynamic_sampling_filter_path)
        self.miles_args = config.miles_args()  # what user functions are given, as in miles
        self.estimator = config.algorithm.estimator(config.rollout)
        self.loss = config.algorithm.loss(config.rollout)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (tokenizer.eos_token_id or 0)
        self.num_rollout = num_rollouts(config.rollout, len(source))
        self.start = 0
        colocate = config.placement.swaps_memory
        self.colocation = colocation or Colocation(trainers, engines, colocate=colocate)
        self.pending: LoraAdapter | None = None
        self.saved: Path | None = None
        self._prompt_ids: dict[str, list[int]] = {}
        self.sync: AdapterSyncProbe | None = None
        if config.misc.check_adapter_sync:
            self.sync = AdapterSyncProbe(self.pad_id, config.rollout.rollout_temperature)

    # ------------------------------------------------------------------ resume / save

    def restore(self) -> int:
        """Resume from ``--load``'s checkpoint (`checkpoint.resume_point`; ``train.py`` checked
        it before Ray started), if any; returns the first rollout to run."""
        root = Path(self.config.checkpoint.load) if self.config.checkpoint.load else None
        resume = checkpoint.resume_point(root)
        if root is None or resume is None:
            return self.start
        path = checkpoint.iter_dir(root, resume.iteration)
        state = checkpoint.load_state(root, resume.iteration)
        self.source.load_state_dict(state["data"])
        self.trainers.load(path)
        self.start = int(state["rollout_index"])
        self.pending = self.trainers.export_adapter()
        self.saved = path / checkpoint.ADAPTER_DIR
        if self.sync is not None:
            self.sync.restore(self.saved)
        print(f"resumed from {path} (next rollout {self.start + 1}/{self.num_rollout})", flush=True)
        return self.start

    def save(self, rollout_index: int) -> Path:
        """A checkpoint under ``--save`` (or, without it, the adapter in <output-dir>/final);
        `checkpoint.SaveError` when it cannot be written."""
        paths = self.config.checkpoint
        if paths.save:
            state = {
                "rollout_index": rollout_index,
                "data": self.source.state_dict(),
                "seed": self.config.misc.seed,
                "train_backend": self.config.placement.train_backend,
            }
            path = checkpoint.save(Path(paths.save), rollout_index, self.save_trainers, state)
        else:
            path = Path(paths.output_dir) / "final"
            checkpoint.write_dir(path, self.save_trainers)
        self.saved = path / checkpoint.ADAPTER_DIR
        return path

    def save_trainers(self, path: Path) -> None:
        """The trainers' files, and with the sync check the adapter's `adapter_check` file."""
        self.trainers.save(path)
        if self.sync is not None:
            self.sync.write(path / checkpoint.ADAPTER_DIR)

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
                if self.due(self.config.checkpoint.save_interval, rollout_id) or last:
                    started = time.perf_counter()
                    path = self.save(rollout_id + 1)
                    print(f"saved {path} ({time.perf_counter() - started:.1f} s)", flush=True)
        finally:
            logger.close()
        return self.saved

    def step(self, rollout_id: int) -> dict[str, float]:
        timer = Timer(self.observe_phase)
        with timer("step"):
            generations, rewards, sampling = self.collect(rollout_id, timer)
            metrics = rollout_metrics(
                generations, rewards, self.config.rollout.n_samples_per_prompt
            )
            metrics.update(sampling)
            advantages, shaping = self.estimator(
                rewards,
                torch.tensor([len(g.response_ids) for g in generations]),
                torch.tensor([g.truncated for g in generations]),
            )
            metrics.update(shaping)
            metrics.update(self.train(generations, advantages, timer))
            if self.sync is not None:
                metrics.update(self.sync.expect(self.trainers, generations[0]))
            with timer("export_adapter"):
                self.pending = self.trainers.export_adapter()
            last = rollout_id + 1 == self.num_rollout
            if self.eval_sets and (self.due(self.config.eval.eval_interval, rollout_id) or last):
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
        rollout = self.config.rollout
        n, target = rollout.n_samples_per_prompt, rollout.rollout_batch_size
        kept: list[tuple[list[Generation], torch.Tensor]] = []
        rejected: list[tuple[list[Generation], torch.Tensor]] = []
        rounds = prompts = 0
        # one phase for every round: the GPUs swap once
        with self.colocation.rollout(timer, update=lambda: self.publish(timer)):
            checked = self.sync.check(self.engines) if self.sync is not None else {}
            while len(kept) < target:
                if self.sampling_filter is not None and prompts >= max(len(self.source), target):
                    kept.extend(rejected[: target - len(kept)])
                    break
                size = rollout.over_sampling_batch_size if self.sampling_filter else target
                samples = self.source.next_batch(size)
                with timer("rollout"):
                    generations = self.generate(
                        samples, rollout_id, evaluation=False, attempt=rounds
                    )
                with timer("reward"):
                    where = f"--prompt-data {self.config.data.prompt_data}"
                    rewards = self.rewards(samples, generations, n, where=where)
                for i, sample in enumerate(samples):
                    group = (generations[i * n : (i + 1) * n], rewards[i * n : (i + 1) * n])
                    keep = self.sampling_filter is None or keeps(
                        self.sampling_filter(self.miles_args, self.graded(sample, *group))
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

    def prompt_ids(self, sample: Sample) -> list[int]:
        if sample.prompt not in self._prompt_ids:
            ids = self.tokenizer.encode(sample.prompt, add_special_tokens=False)
            self._prompt_ids[sample.prompt] = list(ids)
        return self._prompt_ids[sample.prompt]

    def generate(
        self, samples: Sequence[Sample], rollout_id: int, *, evaluation: bool, attempt: int = 0
    ) -> list[Generation]:
        """`n` responses per sample, sampling seeded by (seed, rollout, round): a resumed run
        samples what the uninterrupted run would have (unless ``--no-rollout-request-seeds``)."""
        rollout, evals = self.config.rollout, self.config.eval
        if evaluation:
            n, length = evals.n_samples_per_eval_prompt, evals.eval_max_response_len
            temperature, top_p, salt = evals.eval_temperature, evals.eval_top_p, "eval"
        else:
            n, length = rollout.n_samples_per_prompt, rollout.rollout_max_response_len
            temperature, top_p = rollout.rollout_temperature, rollout.rollout_top_p
            salt = "rollout"
        params = SamplingParams(
            max_new_tokens=length,
            temperature=temperature,
            top_p=top_p,
            top_k=rollout.rollout_top_k,
            seed=self.seed_for(salt, rollout_id, attempt),
            stop_token_ids=rollout.rollout_stop_token_ids or (),
            stop=rollout.rollout_stop or (),
        )
        prompts = [self.prompt_ids(s) for s in samples for _ in range(n)]
        return self.engines.generate(prompts, params)

    def seed_for(self, purpose: str, rollout_id: int, attempt: int) -> int | None:
        """The generate call's seed (`call_seed`), or none with ``--no-rollout-request-seeds``."""
        if not self.config.rollout.rollout_request_seeds:
            return None
        return call_seed(self.config.misc.seed, purpose, rollout_id, attempt)

    def rewards(
        self, samples: Sequence[Sample], generations: Sequence[Generation], n: int, *, where: str
    ) -> torch.Tensor:
        """One reward per generation; a reward that is not a finite number is a `UsageError`
        naming the function and the prompt (row of the set `where` names), raised before any
        optimizer step could train on it."""
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
            raw = call_custom_rewards(self.custom_rm, self.miles_args, graded)
        try:
            values = [reward_value(value, self.config.reward.reward_key) for value in raw]
        except (TypeError, ValueError) as err:
            raise UsageError(str(err)) from None
        for value, sample in zip(values, repeated, strict=True):
            if not math.isfinite(value):
                reward = self.config.reward
                function = (
                    f"--custom-rm-path {reward.custom_rm_path}"
                    if reward.custom_rm_path
                    else f"--rm-type {reward.rm_type}"
                )
                raise UsageError(
                    f"{function} returned {value} for a response to row {sample.index + 1} of "
                    f"{where}: a reward must be a finite number (stopped before training on it)"
                )
        return torch.tensor(values, dtype=torch.float32)

    def train(
        self, generations: Sequence[Generation], advantages: torch.Tensor, timer: Timer
    ) -> dict[str, float]:
        world = self.trainers.world_size
        steps = micro_batches(
            generations,
            advantages,
            self.config.batch,
            world_size=world,
            pad_id=self.pad_id,
            drop_truncated=self.config.algorithm.overlong_filter,
        )
        with timer("logprobs"):
            self.attach_logprobs(steps)
        results: list[dict[str, float]] = []
        with timer("train"):
            for step in steps:
                counts = Normalizer.from_masks(mb.loss_mask for rank in step for mb in rank)
                normalizer = replace(
                    counts, tokens=counts.tokens / world, sequences=counts.sequences / world
                )
                loss_fn = GRPOLoss(self.loss, normalizer)
                results.append(average_results(self.trainers.train_step(step, loss_fn)))
        return {f"train/{k}": sum(r[k] for r in results) / len(results) for k in results[0]}

    def attach_logprobs(self, steps: Steps) -> None:
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
        ref = self.trainers.forward(shards, with_adapter=False) if self.loss.use_kl_loss else none
        for shard, old_out, ref_out in zip(shards, old, ref, strict=True):
            for mb, o, f in zip(shard, old_out, ref_out, strict=True):
                mb.old_logprobs = None if o is None else o.logprobs
                mb.ref_logprobs = None if f is None else f.logprobs

    def evaluate(self, rollout_id: int, timer: Timer) -> dict[str, float]:
        scores = {}
        with self.colocation.rollout(timer, update=lambda: self.publish(timer)):
            for name, samples in self.eval_sets.items():
                generations = self.generate(samples, rollout_id, evaluation=True)
                n = self.config.eval.n_samples_per_eval_prompt
                where = f"--eval-prompt-data {name}"
                rewards = self.rewards(samples, generations, n, where=where)
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
