"""A launcher's value for a ``train.py`` flag, checked against the config field it sets.

Launchers write train.py's flags by name (``harness.flags(lora_alpha=32, ...)``); here each name
is looked up among the training config's fields and the value held to the field's type, so a
misspelt flag or a value of the wrong type fails when the launcher is recorded, naming the flag,
rather than as an argv that the contract test rejects later. The undeclared ``--sglang-<field>``
flags (SGLang's own ServerArgs) take any plain value.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from trainer.config.flags import flag_fields, option
from trainer.config.train import TrainConfig


@functools.cache
def field_types() -> dict[str, Any]:
    """Every flag field of the training config: its name -> its annotation."""
    hints = typing.get_type_hints(TrainConfig)
    found = {}
    for group in dataclasses.fields(TrainConfig):
        group_hints = typing.get_type_hints(hints[group.name])
        for field, _ in flag_fields(hints[group.name]):
            found[field.name] = group_hints[field.name]
    return found


def problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be flag `name`'s, or None."""
    types_by_name = field_types()
    if name not in types_by_name:
        if name.startswith("sglang_") and isinstance(value, str | int | float | bool):
            return None
        return f"train.py has no flag {option(name)}"
    if value is None or _fits(types_by_name[name], value):
        return None
    return f"{option(name)} takes {_spell(types_by_name[name])}, not {value!r}"


def _fits(annotation: Any, value: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(a, value) for a in typing.get_args(annotation) if a is not type(None))
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if origin in (tuple, list):
        (item, *_) = typing.get_args(annotation) or (Any,)
        return isinstance(value, tuple | list) and all(_fits(item, v) for v in value)
    if origin is dict or annotation is Any:
        return True
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _spell(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
