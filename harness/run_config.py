"""A launch's training config: the recipe's, with the launch's own settings over it.

In order: the recipe's config for the launch's directories and run id (`Launcher.config`), each
``--set NAME=VALUE`` of the launch (`trainer.config.overrides`), the tracking that
``--wandb-mode`` and ``WANDB_API_KEY`` allow (`tracked`), and the cluster's placement
(`ClusterShape.place`), which no ``--set`` may say a second time. `render` of the result is the
``python3 train.py`` argv a launcher submits.
"""

from __future__ import annotations

import dataclasses

from harness.cluster_shape import PLACED, ClusterShape
from harness.context import LaunchContext
from harness.errors import LaunchError
from harness.launcher import LauncherArgs
from trainer.config.checkpoint import CheckpointConfig
from trainer.config.flags import option
from trainer.config.overrides import field_name, override
from trainer.config.train import TrainConfig
from trainer.config.wandb import WandbConfig
from trainer.errors import UsageError


def run_checkpoint(args: LauncherArgs, model: str, *, save_interval: int) -> CheckpointConfig:
    """A launch's files: the base model `model` under ``--model-dir``; the run's outputs in
    ``<output-dir>/<run-id>``, its checkpoints in ``checkpoints/`` there, where a rerun with the
    same run id resumes."""
    run = f"{args.output_dir}/{args.run_id}"
    return CheckpointConfig(
        hf_checkpoint=f"{args.model_dir}/{model}",
        load=f"{run}/checkpoints",
        save=f"{run}/checkpoints",
        save_interval=save_interval,
        output_dir=run,
    )


def recipe_config(ctx: LaunchContext, args: LauncherArgs) -> TrainConfig:
    """The recipe's config with every ``--set`` of `args` applied, in order; a setting that
    train.py would refuse on its own (not a number, out of its range) is a `LaunchError`."""
    if ctx.launcher.config is None:
        raise TypeError(f"{ctx.launcher.module} declares no training config")
    config = ctx.launcher.config(args)
    for assignment in args.set:
        name = assignment.partition("=")[0]
        _refuse_placed(name)
        try:
            config = override(config, assignment)
        except UsageError as err:
            raise LaunchError(f"--set {name}: {err}") from None
    resolved = config.resolved({}, needs_gpu=False)  # each group's own problems; the rest:
    if problem := next(resolved.problems(), None):  # the argv contract (`check_train_argv`)
        raise LaunchError(f"train.py would reject its settings: {problem}")
    return config


def _refuse_placed(name: str) -> None:
    try:
        field = field_name(name)
    except UsageError:
        return  # `override` says what is wrong with it
    if field in PLACED:
        raise LaunchError(
            f"--set {name}: {option(field)} follows from the cluster; use --hardware, "
            "--num-nodes or --num-gpus-per-node"
        )


def run_config(ctx: LaunchContext, args: LauncherArgs, cluster: ClusterShape) -> TrainConfig:
    """What train.py is told: `recipe_config`, tracked, placed on `cluster`."""
    return cluster.place(tracked(ctx, args, recipe_config(ctx, args)))


def tracked(ctx: LaunchContext, args: LauncherArgs, config: TrainConfig) -> TrainConfig:
    """`config` logging to wandb when ``--wandb-mode`` allows: offline, or online with
    ``WANDB_API_KEY`` set (its value never in argv: `execute_train` gives it to the job's
    environment); the run id is its wandb group. Otherwise no wandb setting at all."""
    online_without_key = args.wandb_mode == "online" and not ctx.host.env.get("WANDB_API_KEY")
    if args.wandb_mode == "disabled" or online_without_key:
        if online_without_key and not ctx.dry_run:  # a dry run shows it: no wandb flags
            ctx.note("wandb is off: WANDB_API_KEY is not set (--wandb-mode offline logs locally)")
        return dataclasses.replace(config, wandb=WandbConfig())
    wandb = dataclasses.replace(
        config.wandb, use_wandb=True, wandb_group=str(args.run_id), wandb_mode=args.wandb_mode
    )
    return dataclasses.replace(config, wandb=wandb)
