"""The trainer's frozen base weights lent to the engine that merges on the same GPU.

Serving merged weights (``--lora-serving merged``), an engine merges each update into the base
weights of the adapted layers (`lora_merge.LoraMerger`). Read from the checkpoint, those are a
second copy of what the PEFT trainer holds as its frozen base, in the same dtype, with the same
values: 6.8 GiB at the Qwen3-4B shape with LoRA on every linear layer. Where the trainer and the
engine share their one GPU and the base stays on it on both sides, the trainer lends its tensors
instead and the engine merges from them: in one process as they are, across Ray actors as CUDA
IPC handles (torch's pickling of CUDA tensors, the way SGLang's scheduler takes the merged
weights), so the engine maps the trainer's memory and copies nothing.

The base stays where both stay resident (``--colocate-memory keep``), and where SGLang takes
turns with the trainer without ``--lora-base-cpu-backup``: it then gives back its KV cache and
CUDA graphs only, and the trainer keeps its base. With the backup the trainer's base goes to the
host during rollouts, and the transformers engine moves its model and merge base to the host on
every release, so those keep a copy of their own, as an engine does across several GPUs (one
lender, one borrower on one GPU is what is built).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from trainer.config import TrainConfig

# what the job says where it lends
LENT = "the engine merges into the trainer's base weights on their GPU (no copy of its own)"


def lendable(config: TrainConfig, device: str) -> bool:
    """Whether the trainer's base can serve the engine's merge where nothing is swapped: merged
    serving, the PEFT trainer, one training rank and one engine of one GPU, on a GPU
    (`device`: the job's, ``cuda`` or ``cpu``)."""
    placement = config.placement
    return (
        config.lora.merged
        and placement.train_backend == "torch"
        and placement.colocate
        and device.startswith("cuda")
        and placement.actor_num_gpus == 1
        and placement.rollout_num_gpus_per_engine == 1
        and (placement.rollout_num_gpus or 1) == 1
    )


def lends_base(config: TrainConfig, device: str) -> bool:
    """Whether this job's engine merges from the trainer's base: `lendable`, and the base on
    the GPU on both sides all along (the module's doc; ``auto`` decided)."""
    if not lendable(config, device):
        return False
    placement = config.placement
    if not placement.swaps_memory:
        return True
    return placement.rollout_backend == "sglang" and not config.lora.lora_base_cpu_backup


def pack(weights: Mapping[str, torch.Tensor]) -> bytes:
    """`weights` for another process on the same device: CUDA tensors as IPC handles, CPU
    tensors moved into shared memory (the memory stays the lender's, and must outlive the
    borrower's use of it)."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions on ForkingPickler)

    return bytes(ForkingPickler.dumps(dict(weights), pickle.HIGHEST_PROTOCOL))


def unpack(payload: bytes) -> dict[str, torch.Tensor]:
    """The tensors `pack` made, mapped into this process."""
    return pickle.loads(payload)
