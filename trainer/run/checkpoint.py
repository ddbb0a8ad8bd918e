"""Checkpoints: ``<save>/iter_<N>/`` after N rollouts, and a ``latest`` marker written last.

An iteration directory holds what the policy trainer saves (the PEFT adapter in ``adapter/``,
optimizer state as safetensors and JSON, `trainer.run.tensor_state`) and ``state.json`` (rollout
index, data cursor, seed, train backend). It is written into ``iter_<N>.partial``, made anew
(a symlink or another user's directory there is refused), and renamed when complete; then
``latest`` is replaced atomically (`owned_files.write_atomic`). A run killed, or a disk filled,
at any moment therefore leaves complete ``iter_<N>`` directories and a ``latest`` that names
one of them, an older one, or none: a resume takes the newest complete one that verifies
(`resume_point`), so no finished save is lost.

Nothing in a checkpoint is code: a ``torch.save`` file (``*.pt``, a pickle, which runs what it
names when loaded) is what earlier versions wrote, and is refused unread.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import owned_files
from trainer.errors import first_line
from trainer.run import file_checks

LATEST = "latest"
STATE_FILE = "state.json"
ADAPTER_DIR = "adapter"
PARTIAL = ".partial"
_ITER = re.compile(r"iter_(\d{7})")
OLD_FORMAT = (
    "a torch.save (pickle) file of an earlier version, which is never loaded (loading a "
    "pickle runs the code it names)"
)


class CheckpointError(RuntimeError):
    """A ``--load`` directory whose marker names a checkpoint that is not there, or that a kill
    or a full disk left damaged, or one this run cannot resume (one line)."""


class SaveError(RuntimeError):
    """A checkpoint that could not be written (a full disk, say); the earlier ones are whole
    (one line)."""


@dataclass(frozen=True)
class Resume:
    """The checkpoint a run resumes from; `note`: why it is not the one ``latest`` names."""

    iteration: int
    note: str | None = None


def iter_dir(root: Path, iteration: int) -> Path:
    return root / f"iter_{iteration:07d}"


def latest_iteration(root: Path | None) -> int | None:
    """The iteration ``latest`` names; None for no directory, an empty one, or no marker."""
    if root is None or not os.path.lexists(root / LATEST):
        return None
    try:
        text = owned_files.read_text(root / LATEST).strip()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or first_line(err)
        raise CheckpointError(f"{root / LATEST}: cannot be read as a marker ({reason})") from None
    if not text.isdigit():
        raise CheckpointError(f"{root / LATEST}: expected an iteration number, found {text!r}")
    iteration = int(text)
    if not (iter_dir(root, iteration) / STATE_FILE).is_file():
        raise CheckpointError(f"{root / LATEST} names iteration {iteration}, which is incomplete")
    return iteration


def complete_iterations(root: Path) -> list[int]:
    """The iterations of ``root`` saved to the end (renamed from ``.partial``), oldest first."""
    found = [_ITER.fullmatch(p.name) for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
    return sorted(int(match[1]) for match in found if match)


def resume_point(root: Path | None) -> Resume | None:
    """The checkpoint of `root` to resume from, or None to start afresh (no checkpoint).

    The newest complete iteration that verifies, when it is newer than the one ``latest``
    names or there is no ``latest`` (a save that died after its rename: a full disk, a kill),
    with a note saying so; else the one ``latest`` names, which must verify. A damaged newer
    one is passed over with a note; `CheckpointError` when nothing usable is left.
    """
    if root is None or not root.is_dir():
        return None
    named = latest_iteration(root)
    newer = [i for i in complete_iterations(root) if named is None or i > named]
    skipped: list[str] = []
    for iteration in reversed(newer):
        problem = verify_problem(root, iteration)
        if problem is None:
            said = f"{root / LATEST} names {named}" if named is not None else f"no {root / LATEST}"
            note = f"{said}, but {iter_dir(root, iteration).name} is complete: resuming from it"
            return Resume(iteration, "; ".join([*skipped, note]))
        skipped.append(f"passing over {problem}")
    if named is None:
        if skipped:
            raise CheckpointError(
                f"{skipped[0].removeprefix('passing over ')}; no checkpoint of {root} is whole: "
                f"move the damaged iter_* away, or start with an empty --save/--load"
            )
        return None
    verify(root, named)
    return Resume(named, "; ".join(skipped) or None)


def verify_problem(root: Path, iteration: int) -> str | None:
    """``<path>: <why>`` for the first damaged file of checkpoint `iteration`: a file of the
    old pickle format, a file cut short (safetensors and JSON headers), a ``state.json``
    without the rollout index and data cursor; None when it is whole."""
    path = iter_dir(root, iteration)
    if (old := old_format_file(path)) is not None:
        return f"{old}: {OLD_FORMAT}"
    if problem := file_checks.first_problem(p for p in path.rglob("*") if p.is_file()):
        return problem
    if not (path / STATE_FILE).is_file():
        return f"{path / STATE_FILE}: missing"
    state = load_state(root, iteration)
    missing = [key for key in ("rollout_index", "data") if key not in state]
    return f"{path / STATE_FILE}: no {' or '.join(missing)}" if missing else None


def old_format_file(path: Path) -> Path | None:
    """The first ``torch.save`` file (``*.pt``) of checkpoint directory `path`, or None."""
    return min((p for p in path.rglob("*.pt") if not p.is_dir()), default=None)


def verify(root: Path, iteration: int) -> None:
    """Raise `CheckpointError` unless every file of checkpoint `iteration` is whole
    (`verify_problem`)."""
    path = iter_dir(root, iteration)
    if (old := old_format_file(path)) is not None:
        raise CheckpointError(
            f"{old}: {OLD_FORMAT}; start without --load, or with an empty --save directory"
        )
    if (problem := verify_problem(root, iteration)) is not None:
        raise CheckpointError(
            f"{problem}; resume from an earlier checkpoint (move {path} away) or start without "
            "--load"
        )


def save(
    root: Path, iteration: int, save_trainer: Callable[[Path], None], state: Mapping[str, Any]
) -> Path:
    """Write checkpoint `iteration`: trainer files, then ``state.json``, then ``latest``."""
    final = iter_dir(root, iteration)

    def fill(partial: Path) -> None:
        save_trainer(partial)
        owned_files.write_atomic(partial / STATE_FILE, json.dumps(dict(state), indent=2) + "\n")

    write_dir(final, fill)
    try:
        owned_files.write_atomic(root / LATEST, f"{iteration}\n")
    except OSError as err:
        raise SaveError(_failed(final, err)) from None
    return final


def write_dir(final: Path, fill: Callable[[Path], None]) -> None:
    """Make directory `final` whole or not at all: `fill` writes into ``<final>.partial``
    (made anew in a private parent), which then replaces `final`. `SaveError` (one line) when
    it fails to write (a full disk, say): the partial directory is removed, an earlier `final`
    kept."""
    partial = final.with_name(final.name + PARTIAL)
    try:
        owned_files.owned_dir(final.parent)
        owned_files.fresh_dir(partial)
        fill(partial)
        if final.is_symlink():
            final.unlink()
        elif final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
    except owned_files.NotPrivate as err:
        raise SaveError(f"cannot save {final}: {err}") from None
    except Exception as err:
        if (failure := _write_failure(err)) is None:
            raise
        if not partial.is_symlink():
            shutil.rmtree(partial, ignore_errors=True)
        raise SaveError(_failed(final, failure)) from None


def _write_failure(err: BaseException) -> BaseException | None:
    """The file-system error behind `err` (an ``OSError``, or safetensors' error, which wraps
    one), a Ray actor's error by its cause; None for any other error."""
    from safetensors import SafetensorError

    cause = getattr(err, "cause", None) or err
    return cause if isinstance(cause, (OSError, SafetensorError)) else None


def _failed(path: Path, err: BaseException) -> str:
    """One line for a save that failed."""
    reason = getattr(err, "strerror", None) or first_line(err)
    where = getattr(err, "filename", None)
    detail = f"{reason} ({where})" if where else reason
    return f"saving {path} failed: {detail}; the checkpoints before it are whole"


def load_state(root: Path, iteration: int) -> dict[str, Any]:
    return json.loads((iter_dir(root, iteration) / STATE_FILE).read_text(encoding="utf-8"))
