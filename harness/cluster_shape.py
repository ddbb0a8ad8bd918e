"""The shape of a run's Ray cluster, said once.

`LaunchContext.cluster` resolves it from a launcher's arguments (the hardware, its GPUs per
node, the node count) and everything that depends on it derives from that one value: the
``ray start`` of the head and of each worker, the head's wait for its nodes, the Slurm batch
script, and train.py's placement settings (`ClusterShape.place`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.hardware import Hardware
from trainer.config.train import TrainConfig

# train.py's placement settings: derived from the cluster, never set by a recipe or a launch.
PLACED = ("device", "actor_num_nodes", "actor_num_gpus_per_node", "num_gpus_per_node")


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

    def place(self, config: TrainConfig) -> TrainConfig:
        """`config` with train.py's placement on this cluster: the training ranks' nodes and
        ranks per node and, on GPUs, each node's GPUs. The device is named where it is the
        CPU; on GPUs train.py's ``--device auto`` is cuda (the cluster has a GPU per rank)."""
        cpu = self.hardware.device == "cpu"
        placement = dataclasses.replace(
            config.placement,
            device="cpu" if cpu else config.placement.device,
            actor_num_nodes=self.nodes,
            actor_num_gpus_per_node=self.ranks_per_node,
            num_gpus_per_node=None if cpu else self.gpus_per_node,
        )
        return dataclasses.replace(config, placement=placement)
