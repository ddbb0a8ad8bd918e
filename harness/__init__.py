"""The launcher harness: typed steps, the launch context, hardware and platform rules, the CLI.

A launcher imports what it needs from here; see docs/adding-a-launcher.md.
"""

from harness.cluster_shape import ClusterShape
from harness.context import LaunchContext, Plan, build_plan
from harness.errors import LaunchError
from harness.launcher import Launcher, LauncherArgs, arg, multi_node_recordings
from harness.ray_job import execute_train, join_cluster
from harness.recipe import recipe_launcher
from harness.run_config import recipe_config, run_checkpoint
from harness.slurm import write_batch_script
from harness.steps import ClaimRun, HubDownload, RayJobSubmit, RayStart, RayStop, Shell, Step

__all__ = [
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
    "join_cluster",
    "multi_node_recordings",
    "recipe_config",
    "recipe_launcher",
    "run_checkpoint",
    "write_batch_script",
]
