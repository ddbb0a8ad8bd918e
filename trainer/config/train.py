"""The training config: one frozen group per concern, resolved and checked as a whole.

`TrainConfig` holds the groups; each group declares its flags, defaults, help and own checks
(`trainer.config.flags`). Here the groups meet: `resolved` fills the defaults one group derives
from another (the global batch from the rollout's samples, the eval sampling from the rollout's),
`problems` adds the checks that span groups, and `as_dict` is the flat view that
``--validate-only`` prints and wandb records. The backends' part (names, devices, their own
checks) is added by ``trainer.arguments`` from the backend registry, which sits above this
package.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainer.config.algorithm import AlgorithmConfig
from trainer.config.batch import BatchConfig
from trainer.config.checkpoint import CheckpointConfig
from trainer.config.data import DataConfig, RewardConfig
from trainer.config.evaluation import EvalConfig
from trainer.config.flags import non_finite
from trainer.config.lora import LoraConfig
from trainer.config.megatron import MegatronConfig
from trainer.config.misc import MiscConfig
from trainer.config.optimizer import OptimizerConfig
from trainer.config.placement import PlacementConfig
from trainer.config.preflight import PreflightConfig
from trainer.config.rollout import RolloutConfig
from trainer.config.sglang import SGLangConfig
from trainer.config.torch_trainer import TorchConfig
from trainer.config.wandb import WandbConfig


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything ``train.py`` is told, by group. Groups in the order ``--help`` shows them."""

    checkpoint: CheckpointConfig
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    torch: TorchConfig = field(default_factory=TorchConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    misc: MiscConfig = field(default_factory=MiscConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)

    def groups(self) -> Iterator[Any]:
        return (getattr(self, group.name) for group in dataclasses.fields(self))

    def resolved(self, environ: Mapping[str, str], *, needs_gpu: bool) -> TrainConfig:
        """Derived defaults filled in. `needs_gpu`: a selected backend runs on GPUs only."""
        rollout = self.rollout.resolved()
        return replace(
            self,
            rollout=rollout,
            batch=self.batch.resolved(rollout.samples),
            eval=self.eval.resolved(rollout),
            algorithm=self.algorithm.resolved(rollout.n_samples_per_prompt),
            wandb=self.wandb.resolved(environ),
            placement=self.placement.resolved(needs_gpu=needs_gpu),
        )

    @property
    def data_parallel_size(self) -> int:
        """Data-parallel ranks of the training actor group (TP x PP x CP ranks share one)."""
        return self.placement.actor_num_gpus // self.megatron.model_parallel_size

    def problems(self) -> Iterator[str]:
        """Each group's own problems (non-finite numbers first)."""
        for group in self.groups():
            yield from non_finite(group)
        for group in self.groups():
            yield from group.problems()

    def cross_problems(self) -> Iterator[str]:
        """Problems between groups; every group is consistent in itself."""
        rollout = self.rollout
        if self.misc.check_adapter_sync and rollout.rollout_temperature != 1.0:
            yield (
                "--check-adapter-sync compares log-probs at temperature 1: it needs "
                f"--rollout-temperature 1 (got {rollout.rollout_temperature})"
            )
        buffer = self.algorithm.overlong_buffer_len
        if buffer is not None and not 0 < buffer <= rollout.rollout_max_response_len:
            yield (
                f"--overlong-buffer-len must be in (0, --rollout-max-response-len "
                f"{rollout.rollout_max_response_len}] (got {buffer})"
            )
        if self.lora.merged and self.placement.train_backend != "torch":
            yield (
                "--lora-serving merged trains the policy through the merged weights, which only "
                "--train-backend torch does; with Megatron serve the adapter (--lora-serving "
                "adapter)"
            )
        if self.lora.lora_base_cpu_backup and self.placement.colocate_memory == "keep":
            yield (
                "--lora-base-cpu-backup backs the engine's weights up while it releases its "
                "memory, which --colocate-memory keep never does; drop one of them"
            )
        yield from self._batch_problems()
        yield from self._parallel_problems()

    def _batch_problems(self) -> Iterator[str]:
        batch, samples = self.batch, self.rollout.samples
        if batch.num_steps_per_rollout and (
            batch.global_batch_size * batch.num_steps_per_rollout != samples
        ):
            yield (
                f"--global-batch-size {batch.global_batch_size} is not the rollout's samples / "
                f"--num-steps-per-rollout {batch.num_steps_per_rollout}"
            )
        if batch.use_dynamic_global_batch_size:
            if not self.megatron.use_dynamic_batch_size:
                yield "--use-dynamic-global-batch-size needs --use-dynamic-batch-size"
            if batch.global_batch_size != samples:
                yield "--use-dynamic-global-batch-size trains a rollout in one optimizer step"
        if samples % batch.global_batch_size:
            rollout = self.rollout
            yield (
                f"samples per rollout (--rollout-batch-size {rollout.rollout_batch_size} x "
                f"--n-samples-per-prompt {rollout.n_samples_per_prompt} = {samples}) must be a "
                f"multiple of --global-batch-size {batch.global_batch_size}"
            )

    def _parallel_problems(self) -> Iterator[str]:
        actor_gpus, model_parallel = (
            self.placement.actor_num_gpus,
            self.megatron.model_parallel_size,
        )
        batch = self.batch
        if actor_gpus % model_parallel:
            yield f"actor GPUs ({actor_gpus}) must be divisible by TP x PP x CP ({model_parallel})"
            return
        dp = self.data_parallel_size
        if batch.global_batch_size % dp:
            yield (
                f"--global-batch-size {batch.global_batch_size} must be divisible by the "
                f"data-parallel size {dp}"
            )
        elif not self.megatron.use_dynamic_batch_size and (batch.global_batch_size // dp) % (
            batch.micro_batch_size
        ):
            yield (
                f"per-rank batch ({batch.global_batch_size} / {dp} data-parallel ranks = "
                f"{batch.global_batch_size // dp}) must be divisible by --micro-batch-size "
                f"{batch.micro_batch_size}"
            )

    def flat(self) -> dict[str, Any]:
        """Every setting by its flag's name (``lora_rank``, ``lr``, ...), as miles names it."""
        return {
            setting.name: getattr(group, setting.name)
            for group in self.groups()
            for setting in dataclasses.fields(group)
        }

    def miles_args(self) -> argparse.Namespace:
        """The flat ``args`` that miles hands to user functions (``--custom-rm-path``,
        ``--dynamic-sampling-filter-path``), which read settings as ``args.<name>``."""
        return argparse.Namespace(**self.flat())

    def as_dict(self) -> dict[str, Any]:
        """The resolved config as a JSON-able dict (sorted; secret-looking extras redacted):
        what ``--validate-only`` prints and wandb records."""
        shown = {
            **self.flat(),
            "sglang_extra": self.sglang.shown_extra(),
            "meanings": self.algorithm.meanings(self.rollout),
        }
        return dict(sorted(shown.items()))
