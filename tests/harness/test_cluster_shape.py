"""The cluster is said once: train.py's placement flags come from the cluster a launch starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from harness import LaunchContext, Launcher, LauncherArgs, Shell, build_plan
from harness.cluster_shape import ClusterShape
from harness.hardware import get_hardware
from harness.host import record_host
from trainer.arguments import parse_args


def shape(hardware: str, nodes: int, gpus: int, ranks: int) -> ClusterShape:
    return ClusterShape(get_hardware(hardware), nodes, gpus, None, ranks)


def test_the_cluster_places_the_training_ranks():
    config = parse_args(["--hf-checkpoint", "/m", "--prompt-data", "/d", "--lr", "1"])
    placed = shape("H200", 2, 4, 4).place(config).placement
    assert (placed.device, placed.actor_num_nodes, placed.actor_num_gpus_per_node) == (
        "cuda" if config.placement.device == "cuda" else config.placement.device,
        2,
        4,
    )
    assert placed.num_gpus_per_node == 4
    on_cpu = shape("CPU", 2, 0, 3).place(config)
    assert on_cpu.placement.device == "cpu" and on_cpu.placement.actor_num_gpus_per_node == 3
    assert on_cpu.placement.num_gpus_per_node is None
    assert on_cpu.optimizer == config.optimizer, "the rest of the config is the recipe's"


@dataclass(frozen=True)
class CpuArgs(LauncherArgs):
    hardware: Literal["CPU"] = "CPU"


def emit(ctx: LaunchContext, args: CpuArgs) -> None:
    ctx.cluster(args)
    ctx.emit(Shell(("true",)))


def test_a_launcher_for_nodes_without_gpu_must_name_its_ranks():
    launcher = Launcher(__name__, args=CpuArgs, entrypoints=(emit,), recorded_hardware="CPU")
    with pytest.raises(TypeError, match="name the training ranks per node"):
        build_plan(launcher, "emit", host=record_host())
