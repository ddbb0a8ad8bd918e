"""Every ``train.py`` flag has help text, and ``--help`` shows it with the flag's default.

The flags are read from the parser itself, and their number is held to the number of `flag(...)`
fields of every config group in ``trainer/config`` (found by walking the package, not through
`TrainConfig`), so a flag added anywhere, or a group left out of the parser, fails here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import trainer.config
from trainer.arguments import build_parser, parse_args_or_exit
from trainer.config.flags import flag_fields, option


def flag_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every flag the parser accepts, but its own ``-h/--help``."""
    return [
        action
        for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


def config_flag_fields() -> dict[str, str]:
    """``--flag`` -> ``module.Group`` for every `flag(...)` field of every dataclass defined in
    a module of ``trainer.config``."""
    found: dict[str, str] = {}
    for module_info in pkgutil.iter_modules(trainer.config.__path__):
        module = importlib.import_module(f"trainer.config.{module_info.name}")
        for _, group in inspect.getmembers(module, dataclasses.is_dataclass):
            if group.__module__ != module.__name__:
                continue  # imported from another module: counted there
            for field, spec in flag_fields(group):
                name = spec.negated or option(field.name)
                assert name not in found, f"{name} is declared twice"
                found[name] = f"{module_info.name}.{group.__name__}"
    return found


def test_every_flag_has_help() -> None:
    actions = flag_actions(build_parser())
    missing = [
        action.option_strings[0]
        for action in actions
        if not (action.help and action.help.strip()) or action.help == argparse.SUPPRESS
    ]
    assert len(actions) > 100
    assert not missing, f"train.py flags without help text: {', '.join(missing)}"


def test_the_parser_has_exactly_the_flag_fields_of_the_config_groups() -> None:
    parsed = sorted(a.option_strings[0] for a in flag_actions(build_parser()))
    declared = config_flag_fields()
    assert parsed == sorted(declared), (
        f"not in the parser: {sorted(set(declared) - set(parsed))}; "
        f"not a config field: {sorted(set(parsed) - set(declared))}"
    )
    assert len(parsed) == len(declared)


def test_help_shows_the_defaults_that_are_values() -> None:
    actions = {a.option_strings[0]: a for a in flag_actions(build_parser())}
    formatter = build_parser()._get_formatter()
    shown = {name: formatter._get_help_string(action) for name, action in actions.items()}
    assert shown["--lr"].endswith("[default: 1e-05]")
    assert shown["--rollout-top-k"].endswith("[default: -1]")
    assert shown["--advantage-estimator"].endswith("[default: grpo]")
    # a switch, an unset value and an empty one have no default worth showing
    for name in ("--use-wandb", "--disable-grpo-std-normalization", "--global-batch-size",
                 "--apply-chat-template-kwargs", "--hf-checkpoint"):  # fmt: skip
        assert "[default:" not in shown[name], name


def test_train_py_help_prints_every_flag_with_its_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args_or_exit(["--help"])
    assert exit_info.value.code == 0
    # argparse wraps the text, at spaces and after hyphens: compare without any whitespace
    out = "".join(capsys.readouterr().out.split())
    for action in flag_actions(build_parser()):
        assert action.option_strings[0] in out
        assert "".join((action.help or "").split()) in out, action.option_strings[0]
