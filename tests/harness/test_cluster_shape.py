"""The cluster is said once: train.py's placement flags come from the cluster a launch starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from harness import CLUSTER_FLAGS, LaunchContext, Launcher, LauncherArgs, Shell, build_plan
from harness.cluster_shape import ClusterShape
from harness.hardware import get_hardware
from harness.host import record_host


def shape(hardware: str, nodes: int, gpus: int, ranks: int) -> ClusterShape:
    return ClusterShape(get_hardware(hardware), nodes, gpus, None, ranks)


def test_the_flags_go_where_the_recipe_places_them():
    argv = ["--lr", "1", CLUSTER_FLAGS, "--colocate"]
    assert shape("H200", 2, 4, 4).fill(argv) == [
        "--lr", "1", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4",
        "--num-gpus-per-node", "4", "--colocate",
    ]  # fmt: skip
    assert shape("CPU", 2, 0, 3).fill(argv) == [
        "--lr", "1", "--device", "cpu", "--actor-num-nodes", "2",
        "--actor-num-gpus-per-node", "3", "--colocate",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--lr", "1"], "places CLUSTER_FLAGS exactly once"),
        ([CLUSTER_FLAGS, CLUSTER_FLAGS], "places CLUSTER_FLAGS exactly once"),
        ([CLUSTER_FLAGS, "--actor-num-nodes", "1"], "--actor-num-nodes: derived from the cluster"),
        (["--device", "cuda", CLUSTER_FLAGS], "--device: derived from the cluster"),
    ],
)
def test_a_recipe_cannot_say_the_cluster_a_second_time(argv, problem):
    with pytest.raises(TypeError, match=problem):
        shape("H200", 1, 8, 8).fill(argv)


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
