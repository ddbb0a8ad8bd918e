"""The launcher harness: typed steps, the launch context, hardware and platform rules, the CLI.

A launcher imports what it needs from here; see docs/adding-a-launcher.md.
"""

from harness.cluster_shape import CLUSTER_FLAGS, ClusterShape
from harness.context import LaunchContext, Plan, build_plan
from harness.errors import LaunchError
from harness.launcher import (
    Launcher,
    LauncherArgs,
    arg,
    flags,
    multi_node_recordings,
    train_flags,
)
from harness.ray_job import execute_train, join_cluster, wandb_flags
from harness.recipe import launcher_args, recipe_launcher
from harness.slurm import write_batch_script
from harness.steps import ClaimRun, HubDownload, RayJobSubmit, RayStart, RayStop, Shell, Step

__all__ = [
    "CLUSTER_FLAGS",
    "ClaimRun",
    "ClusterShape",
    "HubDownload",
    "LaunchContext",
    "LaunchError",
    "Launcher",
    "LauncherArgs",
    "Plan",
    "RayJobSubmit",
    "RayStart",
    "RayStop",
    "Shell",
    "Step",
    "arg",
    "build_plan",
    "execute_train",
    "flags",
    "join_cluster",
    "launcher_args",
    "multi_node_recordings",
    "recipe_launcher",
    "train_flags",
    "wandb_flags",
    "write_batch_script",
]
