"""Setting one field of a training config by name, as a launcher's ``--set NAME=VALUE`` does.

A field is named by its dotted name (``lora.lora_rank``), its field name (``lora_rank``) or its
train.py flag (``--lora-rank``, ``lora-rank``); its value is read as train.py reads that flag
(`trainer.config.flags.parse_value`). An undeclared ``sglang-<name>`` goes to SGLang's own
server arguments, as train.py's ``--sglang-<name> VALUE`` does. What spans fields (a global batch
that does not divide the samples, say) is train.py's own check of the whole config.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import typing

from trainer.config.flags import flag_fields, option, parse_value
from trainer.config.sglang import PREFIX as SGLANG_PREFIX
from trainer.config.train import TrainConfig
from trainer.errors import UsageError


@functools.cache
def settings() -> dict[str, str]:
    """Every flag field of the training config: its field name -> its group's name."""
    hints = typing.get_type_hints(TrainConfig)
    return {
        field.name: group.name
        for group in dataclasses.fields(TrainConfig)
        for field, _ in flag_fields(hints[group.name])
    }


def field_name(name: str) -> str:
    """The field that `name` (dotted, field or flag spelling) names, or `UsageError`."""
    group, dot, rest = name.strip().partition(".")
    candidate = (rest if dot else group).lstrip("-").replace("-", "_")
    known = settings()
    if candidate in known and (not dot or known[candidate] == group):
        return candidate
    close = difflib.get_close_matches(candidate, known, n=1)
    hint = f" (did you mean {option(close[0])}?)" if close else ""
    raise UsageError(f"train.py has no setting {name!r}{hint}")


def override(config: TrainConfig, assignment: str) -> TrainConfig:
    """`config` with the field that ``NAME=VALUE`` `assignment` names set to VALUE."""
    name, eq, text = assignment.partition("=")
    if not eq:
        raise UsageError(f"--set {name!r}: give NAME=VALUE")
    flag = "--" + name.strip().lstrip("-").replace("_", "-")
    if flag.startswith(SGLANG_PREFIX) and flag.replace("-", "_")[2:] not in settings():
        extra = {**config.sglang.sglang_extra, flag.removeprefix(SGLANG_PREFIX): text}
        return dataclasses.replace(
            config, sglang=dataclasses.replace(config.sglang, sglang_extra=extra)
        )
    field = field_name(name)
    group_name = settings()[field]
    group = getattr(config, group_name)
    try:
        value = parse_value(type(group), field, text)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return dataclasses.replace(config, **{group_name: dataclasses.replace(group, **{field: value})})
