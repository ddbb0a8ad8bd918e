"""Checkpoints: ``<save>/iter_<N>/`` after N rollouts, and a ``latest`` marker written last.

An iteration directory holds what the policy trainer saves (the PEFT adapter in ``adapter/``,
optimizer state) and ``state.json`` (rollout index, data cursor, seeds). It is written under a
temporary name and renamed when complete; then ``latest`` is replaced atomically. A run killed
at any moment therefore leaves ``latest`` naming a complete checkpoint, or no ``latest``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainer import file_checks

LATEST = "latest"
STATE_FILE = "state.json"
ADAPTER_DIR = "adapter"


class CheckpointError(RuntimeError):
    """A ``--load`` directory whose marker names a checkpoint that is not there, or that a kill
    or a full disk left damaged (one line)."""


def iter_dir(root: Path, iteration: int) -> Path:
    return root / f"iter_{iteration:07d}"


def latest_iteration(root: Path | None) -> int | None:
    """The iteration ``latest`` names; None for no directory, an empty one, or no marker."""
    if root is None or not (root / LATEST).is_file():
        return None
    text = (root / LATEST).read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{root / LATEST}: expected an iteration number, found {text!r}")
    iteration = int(text)
    if not (iter_dir(root, iteration) / STATE_FILE).is_file():
        raise CheckpointError(f"{root / LATEST} names iteration {iteration}, which is incomplete")
    return iteration


def verify(root: Path, iteration: int) -> None:
    """Raise `CheckpointError` unless every file of checkpoint `iteration` is whole: its
    ``state.json`` a JSON object with the rollout index and data cursor, each safetensors and
    ``torch.save`` file complete (headers only are read)."""
    path = iter_dir(root, iteration)
    problem = file_checks.first_problem(p for p in path.rglob("*") if p.is_file())
    if problem is None:
        state = load_state(root, iteration)
        missing = [key for key in ("rollout_index", "data") if key not in state]
        problem = f"{path / STATE_FILE}: no {' or '.join(missing)}" if missing else None
    if problem is not None:
        raise CheckpointError(
            f"{problem}; resume from an earlier checkpoint (its number in {root / LATEST}) "
            f"or move {path} away"
        )


def adapter_shape_problem(root: Path, iteration: int, rank: int, alpha: float) -> str | None:
    """How checkpoint `iteration`'s adapter differs from ``--lora-rank`` / ``--lora-alpha``
    (its ``adapter_config.json``), or None: the trainers could not load it into their adapter."""
    config_file = iter_dir(root, iteration) / ADAPTER_DIR / "adapter_config.json"
    if not config_file.is_file():
        return None
    saved = json.loads(config_file.read_text(encoding="utf-8"))
    for flag, key, value in (("--lora-rank", "r", rank), ("--lora-alpha", "lora_alpha", alpha)):
        if key in saved and float(saved[key]) != float(value):
            return (
                f"{config_file}: trained with {flag} {saved[key]:g}, this run asks for {value:g}; "
                f"resume with {flag} {saved[key]:g}, or start without --load"
            )
    return None


def save(
    root: Path, iteration: int, save_trainer: Callable[[Path], None], state: Mapping[str, Any]
) -> Path:
    """Write checkpoint `iteration`: trainer files, then ``state.json``, then ``latest``."""
    final = iter_dir(root, iteration)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_trainer(partial)
    (partial / STATE_FILE).write_text(json.dumps(dict(state), indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(partial, final)
    marker = root / (LATEST + ".tmp")
    marker.write_text(f"{iteration}\n", encoding="utf-8")
    os.replace(marker, root / LATEST)
    return final


def load_state(root: Path, iteration: int) -> dict[str, Any]:
    return json.loads((iter_dir(root, iteration) / STATE_FILE).read_text(encoding="utf-8"))
