"""Config fields that are ``train.py`` flags: one declaration gives the field, its flag and help.

A group of the training config is a frozen dataclass whose fields are declared with `flag`: the
field's name is the flag's name (``lora_rank`` is ``--lora-rank``, miles' own spelling), its type
and default are the flag's, and the field's metadata carries the help, choices and nargs that
argparse shows. `add_group` turns a group into an argparse group, `from_values` builds the group
from what argparse parsed (defaults come from the dataclass alone), and `render_group` turns a
group back into argv, so ``parse(render(group)) == group``. Fields declared with `collected` are
no flags: the parser fills them (the undeclared ``--sglang-*`` flags, the named eval sets).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import re
import shlex
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+([eE][-+]?\d+)?$|^-\d+[eE][-+]?\d+$")
_MISSING: Any = dataclasses.MISSING


@dataclass(frozen=True)
class Flag:
    """How a field appears on the command line."""

    help: str | None = None
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    nargs: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None  # argparse ``type`` where the field's is not enough
    negated: str | None = None  # a boolean that defaults to True: the flag that sets it False


def flag(
    default: Any = _MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    help: str | None = None,
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
    nargs: str | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    negated: str | None = None,
) -> Any:
    """A dataclass field that is a flag; no `default` (nor `factory`) makes the flag required."""
    meta = {"flag": Flag(help, choices, nargs, metavar, parse, negated)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def collected(factory: Callable[[], Any]) -> Any:
    """A field that is no flag of its own: the parser fills it (see the module's docstring)."""
    return dataclasses.field(default_factory=factory)


def option(name: str) -> str:
    """The flag of field `name`: ``lora_rank`` -> ``--lora-rank``."""
    return "--" + name.replace("_", "-")


def is_flag(token: str) -> bool:
    """Whether an argv token names a flag (a negative number is a value)."""
    return token.startswith("-") and not _NEGATIVE_NUMBER.match(token)


def json_object(text: str) -> dict[str, Any]:
    """argparse ``type`` of a flag whose value is a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError("must be a JSON object") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def split_list(value: str | None) -> tuple[str, ...]:
    """A comma list flag's items, stripped, empty ones dropped."""
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def flag_fields(group: type | object) -> Iterator[tuple[dataclasses.Field, Flag]]:
    for field in dataclasses.fields(group):  # type: ignore[arg-type]
        if "flag" in field.metadata:
            yield field, field.metadata["flag"]


def _scalar(annotation: Any) -> tuple[Any, bool]:
    """(the element type, whether it is a tuple) of ``int | None``, ``tuple[str, ...]``, ..."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is tuple:
        return typing.get_args(annotation)[0], True
    return annotation, False


def add_group(
    parser: argparse.ArgumentParser,
    group: type,
    *,
    choices: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """`group`'s flags as an argparse group titled by its ``TITLE``; `choices` supplies the
    choices of fields whose names are known only above the config (the backends')."""
    arguments = parser.add_argument_group(group.TITLE)  # type: ignore[attr-defined]
    for name, kwargs in _arguments(group):
        kwargs = dict(kwargs)
        listed = (choices or {}).get(kwargs["dest"], kwargs.get("choices"))
        if listed is not None:
            kwargs["choices"] = tuple(listed() if callable(listed) else listed)
        arguments.add_argument(name, **kwargs)


@functools.cache
def _arguments(group: type) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(flag, argparse keywords) of each of `group`'s flags, read from its fields once."""
    hints = typing.get_type_hints(group)
    found = []
    for field, spec in flag_fields(group):
        kwargs: dict[str, Any] = {
            "dest": field.name,
            "default": argparse.SUPPRESS,
            "help": spec.help,
        }
        element, many = _scalar(hints[field.name])
        if element is bool:
            kwargs["action"] = "store_false" if spec.negated else "store_true"
        else:
            if spec.parse is not None or element in (int, float):
                kwargs["type"] = spec.parse or element
            kwargs["choices"] = spec.choices
            kwargs["nargs"] = spec.nargs if many else None
            kwargs["metavar"] = spec.metavar
            kwargs["required"] = field.default is _MISSING and field.default_factory is _MISSING
        found.append((spec.negated or option(field.name), kwargs))
    return tuple(found)


def from_values(group: type, values: Mapping[str, Any]) -> Any:
    """The group with the parsed `values` of its flags (absent ones take the field default)."""
    given = {
        field.name: tuple(values[field.name])
        if isinstance(values[field.name], list)
        else values[field.name]
        for field, _ in flag_fields(group)
        if field.name in values
    }
    return group(**given)


def field_default(field: dataclasses.Field) -> Any:
    if field.default_factory is not _MISSING:
        return field.default_factory()
    return field.default


def render_group(group: object) -> list[str]:
    """The argv of `group`'s flags whose values differ from the field defaults."""
    argv: list[str] = []
    for field, spec in flag_fields(group):
        value = getattr(group, field.name)
        if value == field_default(field):
            continue
        name = spec.negated or option(field.name)
        if isinstance(value, bool):
            argv.append(name)
        elif isinstance(value, tuple):
            argv += [name, *map(str, value)]
        elif isinstance(value, dict):
            argv += [name, json.dumps(value)]
        else:
            argv += value_tokens(name, str(value))
    return argv


def value_tokens(name: str, text: str) -> list[str]:
    """``[name, text]``, or ``[name=text]`` where `text` would read as a flag or is empty."""
    return [f"{name}={text}"] if not text or is_flag(text) else [name, text]


def non_finite(group: object) -> Iterator[str]:
    for field, _ in flag_fields(group):
        value = getattr(group, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            yield f"{option(field.name)} must be a finite number (got {value})"


def positive(group: object, *names: str) -> Iterator[str]:
    for name in names:
        value = getattr(group, name)
        if value is not None and value <= 0:
            yield f"{option(name)} must be > 0 (got {value})"


def non_negative(group: object, *names: str) -> Iterator[str]:
    for name in names:
        value = getattr(group, name)
        if value is not None and value < 0:
            yield f"{option(name)} must be >= 0 (got {value})"


def fraction(group: object, *names: str, closed_at_one: bool = False) -> Iterator[str]:
    """Each value in [0, 1), or with `closed_at_one` in (0, 1] (probabilities such as top-p)."""
    for name in names:
        value = getattr(group, name)
        if value is None:
            continue
        if closed_at_one and not 0.0 < value <= 1.0:
            yield f"{option(name)} must be in (0, 1] (got {value})"
        elif not closed_at_one and not 0.0 <= value < 1.0:
            yield f"{option(name)} must be in [0, 1) (got {value})"


def parse_value(group: type, name: str, text: str) -> Any:
    """The value of `group`'s field `name` that `text` gives, read as train.py reads the flag
    (its type, its choices; a list flag's items split as a shell splits them). A boolean reads
    ``true``/``false`` (``1``/``0``, ``yes``/``no``); an empty `text` clears a field whose
    default is None. Raises ``ValueError`` with the reason."""
    field = next(f for f, _ in flag_fields(group) if f.name == name)
    element, many = _scalar(typing.get_type_hints(group)[name])
    if element is bool:
        answer = text.strip().lower()
        if answer not in _BOOLEANS:
            raise ValueError(f"{option(name)} takes true or false, not {text!r}")
        return _BOOLEANS[answer]
    if not text.strip() and field_default(field) is None:
        return None
    flag_name, kwargs = next(item for item in _arguments(group) if item[1]["dest"] == name)
    listed = kwargs.get("choices")
    kwargs = {**kwargs, "required": True, "choices": listed() if callable(listed) else listed}
    parser = argparse.ArgumentParser(prog=option(name), add_help=False, exit_on_error=False)
    parser.add_argument(flag_name, **kwargs)
    tokens = [flag_name, *shlex.split(text)] if many else value_tokens(flag_name, text)
    try:
        parsed = vars(parser.parse_args(tokens))[name]
    except (argparse.ArgumentError, SystemExit) as err:
        raise ValueError(f"{option(name)} {text!r}: {getattr(err, 'message', err)}") from None
    return tuple(parsed) if isinstance(parsed, list) else parsed


_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
