"""Whole-file checks of what ``train.py`` reads, and of the directories it writes.

They run before Ray starts, so that a file a kill or a full disk cut short (a checkpoint's
``state.json``, ``trainer_state.pt`` or adapter, the model's ``model.safetensors``) or an output
directory that cannot be written is one line and exit 2, not an actor dying after minutes of
start-up. Only headers and directories are read: a safetensors header, the central directory of
a ``torch.save`` archive (a zip file whose directory is written last), a small JSON file.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainer.errors import first_line


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a complete safetensors file, or None."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            return None
    except (SafetensorError, OSError) as err:
        return f"not a complete safetensors file ({first_line(err)})"


def torch_archive_problem(path: Path) -> str | None:
    """Why `path` is not a complete ``torch.save`` archive, or None."""
    try:
        with zipfile.ZipFile(path):
            return None
    except (zipfile.BadZipFile, OSError) as err:
        return f"not a complete torch.save archive ({first_line(err)})"


def json_object_problem(path: Path) -> str | None:
    """Why `path` is not a UTF-8 JSON object, or None."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    except UnicodeDecodeError:
        return "not UTF-8"
    except json.JSONDecodeError as err:
        return f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
    return None if isinstance(value, dict) else f"a JSON {_json_type(value)}, not an object"


def first_problem(paths: Iterable[Path]) -> str | None:
    """``<path>: <why>`` for the first damaged file of `paths` (checked by suffix), or None."""
    checks = {
        ".safetensors": safetensors_problem,
        ".pt": torch_archive_problem,
        ".json": json_object_problem,
    }
    for path in sorted(paths):
        check = checks.get(path.suffix)
        if check is not None and (problem := check(path)) is not None:
            return f"{path}: {problem}"
    return None


def writable_dir_problem(path: Path) -> str | None:
    """Make directory `path` (and its parents) and write a file in it; why that fails, or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return None
    except OSError as err:
        return f"cannot write there ({err.strerror or err})"


def _json_type(value: Any) -> str:
    names = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")
