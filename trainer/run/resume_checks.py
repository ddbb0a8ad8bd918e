"""Whether a ``--load`` checkpoint can resume this run, decided before Ray starts.

`checkpoint.resume_point` picks the checkpoint and checks its files are whole; this checks it
fits the run: ``state.json`` (types, the rollout index against ``--num-rollout``, the data
cursor against the prompts), the train backend that saved it, the adapter (its config and its
tensors' ranks against the LoRA flags, every value finite). What the backend itself needs
(`registry.resume_problem`: the PEFT trainer's tensor names and shapes, Megatron's parallel
layout) `trainer.job.main` asks next, from the files alone as well. A checkpoint that fails one
of them would otherwise fail in a training actor after start-up, or resume a different run
without a word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer.config import LoraConfig, TrainConfig
from trainer.run import checkpoint
from trainer.run.data import RolloutDataSource, num_rollouts

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def problem(
    config: TrainConfig, root: Path, iteration: int, source: RolloutDataSource
) -> str | None:
    """The first reason checkpoint `iteration` of `root` cannot resume `config`, or None."""
    path = checkpoint.iter_dir(root, iteration)
    return state_problem(config, path, iteration, source) or adapter_problem(
        path / checkpoint.ADAPTER_DIR, config.lora
    )


def state_problem(
    config: TrainConfig, path: Path, iteration: int, source: RolloutDataSource
) -> str | None:
    """What is wrong with ``state.json`` of checkpoint `path` for this run, or None."""
    where = path / checkpoint.STATE_FILE
    state = json.loads(where.read_text(encoding="utf-8"))
    index = state.get("rollout_index")
    total = num_rollouts(config.rollout, len(source))
    if not isinstance(index, int) or isinstance(index, bool) or index != iteration:
        return f"{where}: rollout_index is {index!r}, not {iteration} (the checkpoint's number)"
    if not 0 < index <= total:
        return (
            f"{where}: the checkpoint is after rollout {index}, beyond this run's {total} "
            "rollouts; raise --num-rollout, or start without --load"
        )
    backend = config.placement.train_backend
    if state.get("train_backend") != backend:
        return (
            f"{where}: saved by --train-backend {state.get('train_backend')}, this run uses "
            f"{backend}; resume with the backend that saved it, or start without --load"
        )
    if (cursor := source.cursor_problem(state["data"])) is not None:
        return f"{where}: {cursor}; start without --load"
    return _consumed_problem(config, where, index, state["data"], len(source))


def _consumed_problem(
    config: TrainConfig, where: Path, index: int, cursor: dict[str, Any], num_prompts: int
) -> str | None:
    """A cursor past what `index` rollouts can take: each takes ``--rollout-batch-size``
    prompts, with a dynamic-sampling filter up to an epoch and an over-sampling batch more."""
    rollout = config.rollout
    per_rollout = num_prompts + rollout.rollout_batch_size + (rollout.over_sampling_batch_size or 0)
    consumed = cursor["epoch"] * num_prompts + cursor["offset"]
    if consumed > index * per_rollout:
        return (
            f"{where}: the data cursor (epoch {cursor['epoch']}, offset {cursor['offset']}) is "
            f"past what {index} rollouts take from {num_prompts} prompts; start without --load"
        )
    return None


def adapter_problem(adapter_dir: Path, lora: LoraConfig) -> str | None:
    """How the saved adapter differs from ``--lora-rank`` / ``--lora-alpha`` (its config, and
    each LoRA tensor's rank), or a value of it that is not finite; None when it fits."""
    import torch
    from safetensors import safe_open

    config_file = adapter_dir / ADAPTER_CONFIG
    saved = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    for flag, key, value in (
        ("--lora-rank", "r", lora.lora_rank),
        ("--lora-alpha", "lora_alpha", lora.lora_alpha),
    ):
        if key in saved and float(saved[key]) != float(value):
            return (
                f"{config_file}: trained with {flag} {saved[key]:g}, this run asks for {value:g}; "
                f"resume with {flag} {saved[key]:g}, or start without --load"
            )
    adapter_file = adapter_dir / ADAPTER_FILE
    if not adapter_file.is_file():
        return f"{adapter_file}: missing; resume from another checkpoint, or start without --load"
    with safe_open(str(adapter_file), framework="pt") as tensors:
        for name in tensors.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
            shape = list(tensors.get_slice(name).get_shape())
            rank = _lora_rank(name, shape)
            if rank is not None and rank != lora.lora_rank:
                return (
                    f"{adapter_file}: {name} {shape} is a rank-{rank} LoRA tensor, but its "
                    f"{ADAPTER_CONFIG} and this run say --lora-rank {lora.lora_rank}; start "
                    "without --load, or resume from a checkpoint whose adapter matches"
                )
            if not torch.isfinite(tensors.get_tensor(name)).all():
                return (
                    f"{adapter_file}: {name} holds NaN or infinite values (the run diverged "
                    "before this save); resume from an earlier checkpoint (move "
                    f"{adapter_dir.parent} away), or start without --load"
                )
    return None


def _lora_rank(name: str, shape: list[int]) -> int | None:
    """The rank a LoRA tensor of PEFT's naming has: A is [rank, in], B is [out, rank]."""
    parts = name.split(".")
    if len(shape) != 2:
        return None
    if "lora_A" in parts or "lora_embedding_A" in parts:
        return shape[0]
    if "lora_B" in parts or "lora_embedding_B" in parts:
        return shape[1]
    return None
