"""The backends: what each one is, in one place.

A `BackendSpec` says everything the rest of the project knows about a backend without importing
it: its ``--train-backend`` / ``--rollout-backend`` name, its display name (docs, the support
matrix), the module of its factory, the packages and modules it needs and whether it runs on GPUs
only (`trainer.job.preflight` checks them at job start), the capabilities it cannot run without
(`trainer.backends.capabilities`, checked with the input before Ray starts), the config group
of the flags only it reads (`trainer.config`), its checks of the config when selected and of the
checkpoint before launch (`trainer.job.main`), and, for a trainer, whether its LoRA adapts fused
projections.
``trainer.arguments`` takes the flags' choices and the backends' checks from here; the config
package sits below and never imports a backend.

Every backend module exposes one factory:

* policy trainers: ``create(config: TrainConfig, device: str, *, total_steps: int)``
  -> `PolicyTrainer` (``total_steps``: optimizer steps of the whole run, for the LR schedule);
* rollout engines: ``create(config: TrainConfig, device: str, *, engine_index: int)``
  -> `RolloutEngine` (``engine_index``: which of the job's engines, for its random seed).

A policy trainer's module may also expose ``resume_problem(config: TrainConfig, path: Path)``
-> ``str | None``: why it cannot resume the checkpoint directory `path` with `config`, from the
files alone, before launch (`resume_problem` below).

The factory hands the backend the groups it reads. ``device`` is ``"cpu"``, ``"cuda"`` or
``"cuda:<index>"`` (the GPU this process drives). Any trainer pairs with any engine: adapters
travel as `LoraAdapter` under PEFT names. Nothing here imports a backend's module before it is
called for (a factory or a check by its dotted name, the LoRA names inside `adapter_targets`),
so naming a missing production backend costs nothing until it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from trainer.backends.base import PolicyTrainer, RolloutEngine
    from trainer.backends.megatron.lora_names import LoraTargets
    from trainer.config import TrainConfig


def _lazy(path: str) -> Callable[..., Any]:
    """The function `path` (``module:name``), its module imported when it is called."""
    module, _, name = path.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


@dataclass(frozen=True)
class BackendSpec:
    name: str
    display: str  # how the docs and the support matrix name it
    module: str  # the module of its ``create`` factory
    packages: tuple[str, ...]  # distributions (``importlib.metadata`` names) it needs
    modules: tuple[str, ...] = ()  # top-level import names it needs beyond those distributions
    needs_gpu: bool = False
    flags: str | None = None  # the `TrainConfig` group of the flags only this backend reads
    checks: Callable[[TrainConfig], Iterable[str]] | None = None  # problems when selected
    # the first problem of the checkpoint for this backend, found before launch (reads its files)
    input_check: Callable[[TrainConfig], str | None] | None = None
    fused_lora: bool = False  # a trainer whose adapters span fused projections (q/k/v, gate/up)
    # what it cannot run without, by name (`trainer.backends.capabilities.CATALOGUE`)
    capabilities: tuple[str, ...] = ()


TRAIN_BACKENDS: dict[str, BackendSpec] = {
    "megatron": BackendSpec(
        "megatron",
        "Megatron-Bridge",
        "trainer.backends.megatron.trainer",
        packages=("torch", "transformers", "megatron-core", "megatron-bridge"),
        # Megatron-Bridge's LoRA layers import Transformer Engine at module level.
        modules=("transformer_engine",),
        needs_gpu=True,
        flags="megatron",
        fused_lora=True,
        capabilities=("megatron.bridge.peft.lora.LoRA", "transformer_engine.pytorch"),
    ),
    "torch": BackendSpec(
        "torch",
        "PyTorch + PEFT",
        "trainer.backends.torch.trainer",
        packages=("torch", "transformers", "peft"),
        flags="torch",
        input_check=_lazy("trainer.backends.torch.targets:problem"),
        capabilities=("peft.LoraConfig",),
    ),
}
ROLLOUT_BACKENDS: dict[str, BackendSpec] = {
    "sglang": BackendSpec(
        "sglang",
        "SGLang",
        "trainer.backends.sglang.rollout",
        packages=("sglang",),
        needs_gpu=True,
        flags="sglang",
        checks=_lazy("trainer.backends.sglang.args:problems"),
    ),
    "hf": BackendSpec(
        "hf",
        "transformers `generate`",
        "trainer.backends.torch.rollout",
        packages=("torch", "transformers", "peft"),
        capabilities=("peft.get_peft_model",),
    ),
}


def train_spec(name: str) -> BackendSpec:
    return _lookup(TRAIN_BACKENDS, name, "--train-backend")


def rollout_spec(name: str) -> BackendSpec:
    return _lookup(ROLLOUT_BACKENDS, name, "--rollout-backend")


def selected(config: TrainConfig) -> tuple[BackendSpec, BackendSpec]:
    """The specs of the config's training and rollout backends."""
    placement = config.placement
    return train_spec(placement.train_backend), rollout_spec(placement.rollout_backend)


def _lookup(table: dict[str, BackendSpec], name: str, flag: str) -> BackendSpec:
    if name not in table:
        raise ValueError(f"{flag} {name!r} is not one of {', '.join(table)}")
    return table[name]


def adapter_targets(config: TrainConfig) -> LoraTargets:
    """The modules the adapter covers, as the selected trainer trains it (a trainer with fused
    projections widens a request to whole groups): what the engines reserve LoRA room for."""
    from trainer.backends.megatron.lora_names import resolve_targets

    fused = train_spec(config.placement.train_backend).fused_lora
    lora = config.lora
    return resolve_targets(lora.target_modules, lora.exclude_modules, fused=fused)


def _factory(spec: BackendSpec) -> Any:
    return importlib.import_module(spec.module).create


def resume_problem(config: TrainConfig, path: Path) -> str | None:
    """The selected trainer's reason not to resume checkpoint `path`, or None (see above)."""
    module = importlib.import_module(train_spec(config.placement.train_backend).module)
    check = getattr(module, "resume_problem", None)
    return check(config, path) if check is not None else None


def create_trainer(config: TrainConfig, device: str, *, total_steps: int) -> PolicyTrainer:
    return _factory(train_spec(config.placement.train_backend))(
        config, device, total_steps=total_steps
    )


def create_rollout(config: TrainConfig, device: str, *, engine_index: int = 0) -> RolloutEngine:
    return _factory(rollout_spec(config.placement.rollout_backend))(
        config, device, engine_index=engine_index
    )
