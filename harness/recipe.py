"""A recipe's launcher: its `prepare` and `train`, and the entrypoints every launcher shares.

A recipe defines its options (a `LauncherArgs` dataclass), `prepare` (what to download or
build) and `train` (the train.py argv it hands to `execute_train`). `recipe_launcher` declares a
launcher of them with the entrypoints that follow from those two and the cluster
(`full_train`, `worker`, `sbatch`) and the recordings of `multi_node_recordings`. A recipe that
serves several platforms offers a factory, ``launcher(__name__, hardware=..., ...)``, whose
launcher's args come from `launcher_args`; a launcher file is then that one declaration.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from harness.context import LaunchContext
from harness.hardware import get_hardware
from harness.launcher import Entrypoint, Launcher, LauncherArgs, arg, multi_node_recordings
from harness.ray_job import join_cluster
from harness.slurm import write_batch_script

A = TypeVar("A", bound=LauncherArgs)


def full_train(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Prepare the inputs (as `prepare`), then train (as `train`)."""
    ctx.launcher.entrypoint("prepare")(ctx, args)
    ctx.launcher.entrypoint("train")(ctx, args)


def worker(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Join this node to the cluster of the head (--head-address) running `train --num-nodes`."""
    join_cluster(ctx, args)


def sbatch(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Write the Slurm batch script of a --num-nodes run (submit it with sbatch)."""
    write_batch_script(ctx, args)


def recipe_launcher(
    module: str,
    *,
    args: type[LauncherArgs],
    prepare: Entrypoint,
    train: Entrypoint,
    recorded_hardware: str,
    evidence: str,
) -> Launcher:
    """The launcher declared by `module` (its ``__name__``): `prepare`, `train`, `full_train`,
    `worker` and `sbatch`, recorded with default options and as a 2-node cluster."""
    return Launcher(
        module,
        args=args,
        entrypoints=(prepare, train, full_train, worker, sbatch),
        recorded_hardware=recorded_hardware,
        evidence=evidence,
        recordings=multi_node_recordings(),
    )


def launcher_args(base: type[A], module: str, hardware: Sequence[str], **defaults: Any) -> type[A]:
    """A launcher's own args: `base` with ``--hardware`` narrowed to `hardware` (and ``auto``,
    the default, where they have GPUs to detect) and other fields' defaults replaced by
    `defaults`. The class is ``Args`` of `module`, the launcher's."""
    hints = typing.get_type_hints(base)
    declared = {item.name: item for item in dataclasses.fields(base)}
    gpus = any(get_hardware(name).device != "cpu" for name in hardware)
    choices = ("auto", *hardware) if gpus else tuple(hardware)
    narrowed = [("hardware", Literal[choices], _default(declared["hardware"], choices[0]))]
    for name, value in defaults.items():
        if name not in declared or name == "hardware":
            raise TypeError(f"{base.__name__} has no field {name!r} to default")
        narrowed.append((name, hints[name], _default(declared[name], value)))
    args = dataclasses.make_dataclass("Args", narrowed, bases=(base,), frozen=True)
    args.__module__ = module
    return args


def _default(declared: dataclasses.Field[Any], value: Any) -> Any:
    """`declared` (a field made by `arg`) with the default `value`, its help and kind kept."""
    return arg(value, declared.metadata["help"], path=declared.metadata.get("path", False))
