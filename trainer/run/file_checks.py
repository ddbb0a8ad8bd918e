"""Whole-file checks of what ``train.py`` reads, and of the directories it writes.

They run before Ray starts, so that a file a kill or a full disk cut short (a checkpoint's
``state.json``, trainer state or adapter, the model's ``model.safetensors``) or an output
directory that cannot be written is one line and exit 2, not an actor dying after minutes of
start-up. Only headers, small JSON files and directories are read, and nothing is created.
"""

from __future__ import annotations

import errno
import json
import os
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
        ".json": json_object_problem,
    }
    for path in sorted(paths):
        check = checks.get(path.suffix)
        if check is not None and (problem := check(path)) is not None:
            return f"{path}: {problem}"
    return None


def writable_dir_problem(path: Path) -> str | None:
    """Why directory `path` could not be made (with its parents) and written, or None. Makes
    nothing: the deepest part of `path` that exists must be a directory this process may
    write into (the run makes the rest when it starts)."""
    existing = path.absolute()
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot write there ({os.strerror(errno.ENOTDIR)})"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot write there ({os.strerror(errno.EACCES)})"
    return None


def _json_type(value: Any) -> str:
    names = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")
