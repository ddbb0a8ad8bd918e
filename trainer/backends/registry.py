"""``--train-backend`` / ``--rollout-backend`` names -> backend factories, imported lazily.

Every backend module exposes one factory:

* policy trainers: ``create(args: argparse.Namespace, device: str, *, total_steps: int)``
  -> `PolicyTrainer` (``total_steps``: optimizer steps of the whole run, for the LR schedule);
* rollout engines: ``create(args: argparse.Namespace, device: str, *, engine_index: int)``
  -> `RolloutEngine` (``engine_index``: which of the job's engines, for its random seed).

``device`` is ``"cpu"``, ``"cuda"`` or ``"cuda:<index>"`` (the GPU this process drives). Any
trainer pairs with any engine: adapters travel as `LoraAdapter` under PEFT names. Nothing here
imports a backend until its factory is called, so naming a missing production backend costs
nothing until it is used (and `trainer.preflight` reports it first, from `packages`).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.backends.base import PolicyTrainer, RolloutEngine


@dataclass(frozen=True)
class BackendSpec:
    name: str
    module: str
    packages: tuple[str, ...]  # distributions (``importlib.metadata`` names) it needs
    modules: tuple[str, ...] = ()  # top-level import names it needs beyond those distributions
    needs_gpu: bool = False


TRAIN_BACKENDS: dict[str, BackendSpec] = {
    "megatron": BackendSpec(
        "megatron",
        "trainer.backends.megatron_trainer",
        packages=("torch", "transformers", "megatron-core", "megatron-bridge"),
        # Megatron-Bridge's LoRA layers import Transformer Engine at module level.
        modules=("transformer_engine",),
        needs_gpu=True,
    ),
    "torch": BackendSpec(
        "torch", "trainer.backends.peft_trainer", packages=("torch", "transformers", "peft")
    ),
}
ROLLOUT_BACKENDS: dict[str, BackendSpec] = {
    "sglang": BackendSpec(
        "sglang", "trainer.backends.sglang_rollout", packages=("sglang",), needs_gpu=True
    ),
    "hf": BackendSpec(
        "hf", "trainer.backends.hf_rollout", packages=("torch", "transformers", "peft")
    ),
}


def train_spec(name: str) -> BackendSpec:
    return _lookup(TRAIN_BACKENDS, name, "--train-backend")


def rollout_spec(name: str) -> BackendSpec:
    return _lookup(ROLLOUT_BACKENDS, name, "--rollout-backend")


def _lookup(table: dict[str, BackendSpec], name: str, flag: str) -> BackendSpec:
    if name not in table:
        raise ValueError(f"{flag} {name!r} is not one of {', '.join(table)}")
    return table[name]


def gpu_index(device: str) -> int:
    """``cuda:3`` -> 3; ``cuda`` -> 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0


def _factory(spec: BackendSpec) -> Any:
    return importlib.import_module(spec.module).create


def create_trainer(args: argparse.Namespace, device: str, *, total_steps: int) -> PolicyTrainer:
    return _factory(train_spec(args.train_backend))(args, device, total_steps=total_steps)


def create_rollout(
    args: argparse.Namespace, device: str, *, engine_index: int = 0
) -> RolloutEngine:
    return _factory(rollout_spec(args.rollout_backend))(args, device, engine_index=engine_index)
