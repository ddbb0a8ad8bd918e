"""The shape of a run's Ray cluster, said once.

`LaunchContext.cluster` resolves it from a launcher's arguments (the hardware, its GPUs per
node, the node count) and everything that depends on it derives from that one value: the
``ray start`` of the head and of each worker, the head's wait for its nodes, the Slurm batch
script, and train.py's placement flags, which a recipe places in its train argv with
`CLUSTER_FLAGS` and `execute_train` writes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from harness.hardware import Hardware
from harness.launcher import flag, train_flags


class Placeholder(enum.Enum):
    """A place in a train argv that `execute_train` fills."""

    CLUSTER_FLAGS = "CLUSTER_FLAGS"


CLUSTER_FLAGS = Placeholder.CLUSTER_FLAGS
TrainArgv = Sequence[str | Placeholder]

# train.py's placement flags: derived from the cluster, never written by a recipe.
DERIVED_FLAGS = tuple(
    flag(name)
    for name in ("device", "actor_num_nodes", "actor_num_gpus_per_node", "num_gpus_per_node")
)


@dataclass(frozen=True)
class ClusterShape:
    """`nodes` nodes of `hardware`, each giving Ray `gpus_per_node` GPUs and `cpus_per_node`
    CPUs (None: Ray counts them), with `ranks_per_node` training ranks on each."""

    hardware: Hardware
    nodes: int
    gpus_per_node: int
    cpus_per_node: int | None
    ranks_per_node: int

    @property
    def gpus(self) -> int:
        """The GPUs of the whole cluster: what the head waits for."""
        return self.nodes * self.gpus_per_node

    def train_flags(self) -> list[str]:
        """train.py's placement flags: the training ranks' nodes and ranks per node and, on
        GPUs, each node's GPUs. The device is named where it is the CPU; on GPUs train.py's
        ``--device auto`` is cuda (the cluster has a GPU per rank)."""
        cpu = self.hardware.device == "cpu"
        return train_flags(
            device="cpu" if cpu else None,
            actor_num_nodes=self.nodes,
            actor_num_gpus_per_node=self.ranks_per_node,
            num_gpus_per_node=None if cpu else self.gpus_per_node,
        )

    def fill(self, train_argv: TrainArgv) -> list[str]:
        """`train_argv` with its `CLUSTER_FLAGS` replaced by `train_flags`.

        A train argv places `CLUSTER_FLAGS` once and writes none of `DERIVED_FLAGS` itself
        (a launcher bug: TypeError)."""
        if list(train_argv).count(CLUSTER_FLAGS) != 1:
            raise TypeError("a train argv places CLUSTER_FLAGS exactly once")
        if written := [a for a in train_argv if isinstance(a, str) and a in DERIVED_FLAGS]:
            raise TypeError(f"{', '.join(written)}: derived from the cluster (CLUSTER_FLAGS)")
        argv: list[str] = []
        for item in train_argv:
            argv += self.train_flags() if item is CLUSTER_FLAGS else [str(item)]
        return argv
