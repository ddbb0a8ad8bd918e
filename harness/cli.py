"""A launcher's command line: its dataclass becomes a typer app, one subcommand per entrypoint.

``python -m launchers.<path> <entrypoint> [--field value ...] [--dry-run]``. Every field is an
option with its help text; ``GRPO_LAUNCHER_<FIELD>`` sets it from the environment; ``Literal``
fields take only their choices. ``--dry-run`` prints what would run on this host and runs
nothing. Any bad input is one line on stderr and exit status 2, with nothing launched.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import signal
import sys
import typing
from collections.abc import Callable
from typing import Any, NoReturn

import typer

from harness.context import Plan, build_plan, check_local_outputs
from harness.errors import LaunchError, Terminated
from harness.host import HostView, local_host
from harness.launcher import Launcher
from harness.record import recording_of
from trainer.config.flags import field_default, flag_fields, option

ENV_PREFIX = "GRPO_LAUNCHER_"
LiveRunner = Callable[[Plan], int]


def run(
    launcher: Launcher,
    argv: list[str] | None = None,
    *,
    live: LiveRunner | None = None,
    host: Callable[[], HostView] = local_host,
) -> int:
    """Parse `argv`, build and validate the plan, then print it (``--dry-run``) or run it live.

    Returns the exit status. `live` (default: `run_live`) and `host` are parameters so tests
    can choose the runner and the host view explicitly.
    """
    prog = f"python -m {launcher.module}"
    command = typer.main.get_command(build_app(launcher, live, host))
    try:
        status = command.main(
            args=sys.argv[1:] if argv is None else argv, prog_name=prog, standalone_mode=False
        )
    except typer.TyperException as err:
        message = err.format_message().replace("Value error, ", "")
        if source := _environment_source(err, sys.argv[1:] if argv is None else argv):
            message = f"{source}: {message}"
        return _fail(prog, message, getattr(err, "exit_code", 2))
    except LaunchError as err:
        return _fail(prog, str(err), 2)
    except _Stopped as stopped:
        return _fail(prog, stopped.reason, stopped.status)
    return status if isinstance(status, int) else 0


class _Stopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP ended a live run (after its cleanup): a reason and an exit
    status."""

    def __init__(self, reason: str, status: int) -> None:
        super().__init__(reason)
        self.reason, self.status = reason, status


def main(launcher: Launcher, argv: list[str] | None = None) -> NoReturn:
    """Run `launcher`'s command line (``python -m launchers.<path> <entrypoint> ...``)."""
    raise SystemExit(run(launcher, argv))


def _environment_source(err: Exception, argv: list[str]) -> str | None:
    """``NAME='value'`` when the bad value of `err` came from an environment variable."""
    param = getattr(err, "param", None)
    name = getattr(param, "envvar", None)
    if not isinstance(name, str) or name not in os.environ:
        return None
    options = getattr(param, "opts", ())
    if any(arg == opt or arg.startswith(f"{opt}=") for arg in argv for opt in options):
        return None  # the command line gave it
    return f"{name}={os.environ[name]!r}"


def _fail(prog: str, message: str, status: int) -> int:
    if "\n\n" in message:  # the usage text typer shows for a bare invocation
        print(message, file=sys.stderr)
    else:
        print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


def build_app(
    launcher: Launcher, live: LiveRunner | None, host: Callable[[], HostView]
) -> typer.Typer:
    app = typer.Typer(
        help=(
            f"{launcher.summary}\n\nEvery option can also be set as an environment variable "
            f"{ENV_PREFIX}<OPTION> (say {ENV_PREFIX}NUM_NODES=2)."
        ),
        add_completion=False,
        no_args_is_help=True,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
    )
    app.callback()(_no_op)  # a group even with one entrypoint: the subcommand is always named
    settings = settings_help(launcher)
    for function in launcher.entrypoints:
        trains = function.__name__ in ("train", "full_train", "sbatch", "rayjob")
        app.command(
            name=function.__name__.replace("_", "-"),
            help=inspect.getdoc(function),
            epilog=settings if trains else None,
        )(_entrypoint_command(launcher, function.__name__, live, host))
    return app


def settings_help(launcher: Launcher) -> str | None:
    """The training settings the launcher's recipe chooses, each with its value and its help,
    for the help of the entrypoints that train (``--set`` changes any of train.py's)."""
    if launcher.config is None:
        return None
    config = launcher.config(launcher.args(run_id="RUN_ID"))
    lines = []
    for group in config.groups():
        for field, spec in flag_fields(group):
            value = getattr(group, field.name)
            if value != field_default(field):
                lines.append(f"  {_spelled(field.name, value, spec.negated)}: {spec.help or ''}")
    head = "Training settings of this recipe (any train.py setting: --set NAME=VALUE; all of "
    head += "them: python3 train.py --help):"
    return "\b\n" + "\n".join([head, *lines])  # \b: click keeps the lines as they are


def _spelled(name: str, value: Any, negated: str | None) -> str:
    """A setting as train.py's flag says it: a bare flag for a boolean (its negation for False)."""
    if isinstance(value, bool):
        return option(name) if value else negated or f"{option(name)}=false"
    shown = " ".join(map(str, value)) if isinstance(value, tuple) else value
    return f"{option(name)} {shown}"


def _no_op() -> None:
    """The group's callback."""


def _entrypoint_command(
    launcher: Launcher, entrypoint: str, live: LiveRunner | None, host: Callable[[], HostView]
) -> Callable[..., int]:
    def command(**values: Any) -> int:
        dry_run = values.pop("dry_run")
        values = {name: tuple(v) if isinstance(v, list) else v for name, v in values.items()}
        args = launcher.args(**values)
        plan = build_plan(launcher, entrypoint, args, host(), dry_run=dry_run)
        for note in plan.notes:
            print(note, file=sys.stderr)
        if dry_run:
            sys.stdout.write(recording_of(plan).text)
            return 0
        runner = live or run_live
        try:
            return runner(plan)
        except Terminated as stopped:
            reason = "hung up" if stopped.signum == signal.SIGHUP else "terminated"
            raise _Stopped(reason, 128 + stopped.signum) from None
        except KeyboardInterrupt:  # typer would swallow it into a silent exit status 130
            raise _Stopped("interrupted", 130) from None

    parameters = [*_field_parameters(launcher.args), _DRY_RUN]
    command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in parameters}
    return command


def run_live(plan: Plan) -> int:
    """The live runner: check what this host must allow, then run the plan's steps."""
    from harness.live import execute_plan  # live mode's imports (psutil, Ray) only here

    check_local_outputs(plan)
    return execute_plan(plan)


_DRY_RUN = inspect.Parameter(
    "dry_run",
    inspect.Parameter.KEYWORD_ONLY,
    annotation=bool,
    default=typer.Option(False, "--dry-run", help="print what would run on this host; run nothing"),
)


def _field_parameters(args_type: type) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(args_type)
    parameters = []
    for field in dataclasses.fields(args_type):
        spelling = option(field.name)
        if hints[field.name] is bool:
            spelling = f"{spelling}/--no-{spelling[2:]}"
        default = (
            field.default_factory()
            if field.default is dataclasses.MISSING
            and field.default_factory is not dataclasses.MISSING
            else field.default
        )
        annotation = hints[field.name]
        if typing.get_origin(annotation) is tuple:  # a repeatable option: click's multiple
            annotation, default = list[typing.get_args(annotation)[0]], list(default)
        parameters.append(
            inspect.Parameter(
                field.name,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=annotation,
                default=typer.Option(
                    default,
                    spelling,
                    help=field.metadata.get("help"),
                    metavar=field.metadata.get("metavar"),
                    envvar=ENV_PREFIX + field.name.upper(),
                    show_envvar=False,
                ),
            )
        )
    return parameters
