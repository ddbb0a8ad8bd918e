"""A recipe's launcher: its args, its training config, its `prepare` and `train`, and the
entrypoints every launcher shares.

A launcher file declares its options (a `LauncherArgs` dataclass: launch concerns only), the
training config it trains (a function of those args: a `TrainConfig` built from the
``trainer.config`` groups), `prepare` (what to download or build) and `train` (which hands the
launch to `execute_train`). `recipe_launcher` declares the launcher of them with the entrypoints
that follow from those and the cluster (`full_train`, `worker`, `sbatch`, `rayjob`) and the
recordings of `multi_node_recordings`. A recipe shared by several platforms is a module of those
functions that each platform's launcher file calls with its choices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.bundle_launch import prepare_or_verify
from harness.context import LaunchContext
from harness.kuberay import write_rayjob
from harness.launcher import Entrypoint, Launcher, LauncherArgs, multi_node_recordings
from harness.ray_job import join_cluster
from harness.slurm import write_batch_script
from trainer.config.train import TrainConfig


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


def rayjob(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Write the KubeRay RayJob manifest of the run (--image; apply it with kubectl)."""
    write_rayjob(ctx, args)


def recipe_launcher(
    module: str,
    *,
    args: type[LauncherArgs],
    config: Callable[[Any], TrainConfig],
    prepare: Entrypoint,
    train: Entrypoint,
    recorded_hardware: str,
    evidence: str,
) -> Launcher:
    """The launcher declared by `module` (its ``__name__``): it trains `config` of its `args`,
    with `prepare`, `train`, `full_train`, `worker`, `sbatch` and `rayjob`, recorded with
    default options and as a 2-node cluster (`multi_node_recordings`)."""
    prepare = prepare_or_verify(prepare)  # --from-bundle: check the bundle instead
    return Launcher(
        module,
        args=args,
        config=config,
        entrypoints=(prepare, train, full_train, worker, sbatch, rayjob),
        recorded_hardware=recorded_hardware,
        evidence=evidence,
        recordings=multi_node_recordings(),
    )
