"""The argv contract of ``train.py``: argv <-> `TrainConfig`, every flag and its validation.

`parse_args` parses AND validates; any problem raises `UsageError` with a one-line message (never
SystemExit, never a traceback for the user). `parse_args_or_exit` is what ``train.py`` calls: it
prints ``train.py: error: <message>`` and exits 2. Derived defaults (``--eps-clip-high``,
``--rollout-num-gpus``, ``--global-batch-size``, ...) are filled in by `parse_args`, so every
consumer reads resolved values. `render` is its inverse: the argv of a config, which
`parse_args` reads back to the same config. Nothing here touches the filesystem or probes
devices: launchers validate recorded argv with `parse_args` on hosts where the paths and GPUs do
not exist.

The flags are the fields of the config's groups (`trainer.config`); the backend registry
(`trainer.backends.registry`) gives the backends' names, their GPU needs and their checks.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import sys
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from trainer.backends import registry
from trainer.backends.capabilities import CATALOGUE
from trainer.config import TrainConfig
from trainer.config.flags import (
    add_group,
    flag_fields,
    from_values,
    is_flag,
    render_group,
    value_tokens,
)
from trainer.config.misc import MAX_SEED
from trainer.config.sglang import PREFIX as SGLANG_PREFIX
from trainer.errors import UsageError

__all__ = [
    "MAX_SEED", "PROG", "UsageError", "build_parser", "exit_usage", "parse_args",
    "parse_args_or_exit", "render",
]  # fmt: skip

PROG = "train.py"
# Megatron model-architecture flags of miles' launchers: Bridge mode reads them from the HF config.
_MEGATRON_ARCHITECTURE = frozenset(
    [
        "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
        "--group-query-attention", "--num-query-groups", "--kv-channels",
        "--max-position-embeddings", "--position-embedding-type", "--rotary-base",
        "--rotary-percent", "--rotary-scaling-factor", "--normalization", "--norm-epsilon",
        "--swiglu", "--untie-embeddings-and-output-weights", "--vocab-size",
        "--make-vocab-size-divisible-by", "--disable-bias-linear", "--add-qkv-bias",
        "--qk-layernorm", "--use-rotary-position-embeddings", "--seq-length",
        "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
        "--qk-pos-emb-head-dim", "--v-head-dim", "--num-experts", "--spec",
    ]
)  # fmt: skip
_GROUPS = typing.get_type_hints(TrainConfig)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(" ".join(message.split()))


def _shown_defaults() -> dict[str, str]:
    """Each flag's default as ``--help`` shows it, by field name: values only. A switch, an
    unset (None) or empty default shows none: the flag's absence is its default, and a derived
    default is the help text's to say."""
    shown = {}
    for group in _GROUPS.values():
        for field, _ in flag_fields(group):
            value = field.default
            if field.default_factory is not dataclasses.MISSING:
                value = field.default_factory()
            if value is dataclasses.MISSING or value is None or isinstance(value, bool):
                continue
            if isinstance(value, tuple | dict) and not value:
                continue
            shown[field.name] = str(value)
    return shown


_SHOWN_DEFAULTS = _shown_defaults()


class _HelpFormatter(argparse.HelpFormatter):
    """``--help`` with each flag's default after its help, as the launchers show theirs (the
    parser's own defaults are SUPPRESS: the config's fields hold them)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        default = _SHOWN_DEFAULTS.get(action.dest)
        if default is None or not action.option_strings:
            return text
        shown = f"[default: {default}]".replace("%", "%%")  # argparse %-formats help
        return f"{text} {shown}" if text else shown


def build_parser() -> argparse.ArgumentParser:
    """argparse over every group's flags; the backend choices are the registry's names."""
    parser = _Parser(
        prog=PROG,
        description="GRPO LoRA trainer on Ray.",
        allow_abbrev=False,
        formatter_class=_HelpFormatter,
    )
    backends = {
        "train_backend": tuple(registry.TRAIN_BACKENDS),
        "rollout_backend": tuple(registry.ROLLOUT_BACKENDS),
        "require_capability": tuple(CATALOGUE),
    }
    for group in _GROUPS.values():
        add_group(parser, group, choices=backends)
    return parser


def parse_args(argv: Sequence[str]) -> TrainConfig:
    """Parse and validate ``train.py``'s argv; raise `UsageError` on any problem."""
    parser = build_parser()
    known, sglang_extra = _split_argv(parser, list(argv))
    values = vars(parser.parse_args(known))
    groups = {name: from_values(group, values) for name, group in _GROUPS.items()}
    groups["sglang"] = dataclasses.replace(groups["sglang"], sglang_extra=sglang_extra)
    config = TrainConfig(**groups)
    needs_gpu = any(spec.needs_gpu for spec in registry.selected(config))
    config = config.resolved(os.environ, needs_gpu=needs_gpu)
    for problem in problems(config):
        raise UsageError(problem)
    return config


def parse_args_or_exit(argv: Sequence[str] | None = None) -> TrainConfig:
    """`parse_args` for ``main``: a bad argv prints one line to stderr and exits 2."""
    try:
        return parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as err:
        exit_usage(err)


def exit_usage(err: UsageError | str) -> NoReturn:
    print(f"{PROG}: error: {err}", file=sys.stderr)
    raise SystemExit(2)


def render(config: TrainConfig) -> list[str]:
    """The argv of `config`: every flag whose value is not its default, group by group, then
    the ``--sglang-*`` extras. ``parse_args(render(config))`` is `config` again, resolved."""
    argv = [token for group in config.groups() for token in render_group(group)]
    for key, value in config.sglang.sglang_extra.items():
        argv += value_tokens(SGLANG_PREFIX + key, value)
    return argv


def problems(config: TrainConfig) -> Iterator[str]:
    """Everything wrong with a resolved config, most basic first: each group's own problems,
    flags of a backend that is not selected, problems between groups, then the selected
    backends' own checks."""
    yield from config.problems()
    kinds = (
        ("--train-backend", registry.TRAIN_BACKENDS, config.placement.train_backend),
        ("--rollout-backend", registry.ROLLOUT_BACKENDS, config.placement.rollout_backend),
    )
    for flag, table, chosen in kinds:
        for name, spec in table.items():
            if name != chosen and spec.flags is not None:
                for given in getattr(config, spec.flags).backend_only_flags():
                    yield f"{given} needs {flag} {name}"
    yield from config.cross_problems()
    selected = [table[chosen] for _, table, chosen in kinds]
    if config.placement.device == "cpu" and any(spec.needs_gpu for spec in selected):
        yield "--device cpu works only with " + " and ".join(
            f"{flag} {'/'.join(name for name, spec in table.items() if not spec.needs_gpu)}"
            for flag, table, _ in kinds
        )
    for spec in selected:
        if spec.checks is not None:
            yield from spec.checks(config)


def _split_argv(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], dict[str, str]]:
    """Separate undeclared ``--sglang-*`` flags from the rest; reject any other unknown flag.

    Error messages name flags only, never values (a value may be a secret).
    """
    actions = parser._option_string_actions
    known: list[str] = []
    sglang_extra: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not is_flag(token):
            previous = next((t for t in reversed(argv[:i]) if is_flag(t)), None)
            where = f"after {previous.split('=', 1)[0]}" if previous else "before any flag"
            raise UsageError(f"unexpected value {where} (train.py takes only --flags)")
        name, eq, inline = token.partition("=")
        action = actions.get(name)
        if action is not None:
            taken = _values_taken(action.nargs, argv, i + 1, has_inline=bool(eq))
            known.extend(argv[i : i + 1 + taken])
            i += 1 + taken
            continue
        if name.startswith(SGLANG_PREFIX) and len(name) > len(SGLANG_PREFIX):
            key = name[len(SGLANG_PREFIX) :].replace("_", "-")
            if eq:
                sglang_extra[key] = inline
                i += 1
                continue
            values = []
            i += 1
            while i < len(argv) and not is_flag(argv[i]):
                values.append(argv[i])
                i += 1
            sglang_extra[key] = " ".join(values) if values else "true"
            continue
        raise UsageError(_unknown_flag_message(name, actions))
    return known, sglang_extra


def _values_taken(nargs: Any, argv: list[str], start: int, *, has_inline: bool) -> int:
    """How many tokens after a declared flag are its values (so strays can be reported)."""
    if has_inline or nargs == 0:
        return 0
    following = 0
    while start + following < len(argv) and not is_flag(argv[start + following]):
        following += 1
    if nargs is None or nargs == "?":
        return min(following, 1)
    if nargs in ("+", "*"):
        return following
    return min(following, int(nargs))


def _unknown_flag_message(name: str, actions: Mapping[str, argparse.Action]) -> str:
    if name == "--wandb-key":
        return "--wandb-key is not accepted: put WANDB_API_KEY in the job's environment instead"
    if name in _MEGATRON_ARCHITECTURE or name.startswith("--moe-"):
        return (
            f"{name} is a Megatron architecture flag: Bridge mode reads the architecture from "
            "the HF config of --hf-checkpoint; drop it"
        )
    close = difflib.get_close_matches(name, [a for a in actions if a.startswith("--")], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"unrecognized argument {name}{hint}"
