"""A colocated trainer's GPU memory while the rollout engine holds the GPU.

With LoRA only the adapter learns: the base weights never change, so they are copied once to
pinned host memory and afterwards only freed and restored (one host-to-device copy per rollout,
never a device-to-host one). The optimizer's state changes every step, so `OptimizerState`
copies it out and back each rollout (Adam's two moments: twice the adapter in float32, 1 GiB at
Qwen3-4B with rank 64 on every linear layer: by the bus's speed about 0.1 s both ways, not
yet measured); the adapter itself stays.
Without ``--lora-base-cpu-backup`` the base and the optimizer's state stay on the GPU too and only
the allocator's cached blocks are given back, which is what the engine's KV cache needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trainer.backends.devices import empty_cache, host_buffer


class FrozenWeights:
    def __init__(self, parameters: Iterable[Any], device: Any, *, cpu_backup: bool) -> None:
        """`parameters`: the model's parameters (tied ones may repeat); `device`: a torch.device."""
        self.device = device
        self.cpu_backup = cpu_backup
        unique = {id(p): p for p in parameters}
        self._frozen = [p for p in unique.values() if not p.requires_grad]
        self._copies: list[Any] = []
        self.released = False

    def release(self) -> None:
        import torch

        if self.released:
            raise RuntimeError("release_memory called twice without resume_memory")
        if self.cpu_backup:
            if not self._copies:
                self._copies = [host_buffer(p, self.device).copy_(p.data) for p in self._frozen]
            for param in self._frozen:
                param.data = torch.empty(0, dtype=param.dtype, device=self.device)
        empty_cache(self.device)
        self.released = True

    def restore(self) -> None:
        import torch

        if not self.released:
            raise RuntimeError("resume_memory called without release_memory")
        if self.cpu_backup:
            for param, copy in zip(self._frozen, self._copies, strict=True):
                param.data = copy.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.released = False


class OptimizerState:
    """An optimizer's state tensors that live with their parameter (Adam's moments) in pinned
    host memory while released: copied out on each `release` into buffers made once per
    parameter, back to the parameter's device on `restore`. The caller gives the freed blocks
    back to the device (`FrozenWeights.release` does). A buffer is written again only by the
    next release's copy, queued behind the restore's reads of it on the same stream."""

    def __init__(self, optimizer: Any, device: Any) -> None:
        self.optimizer = optimizer
        self.device = device
        self._host: dict[tuple[int, str], Any] = {}
        self.released = False

    def release(self) -> None:
        import torch

        if self.released:
            raise RuntimeError("release_memory called twice without resume_memory")
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) or value.device != param.device:
                    continue  # e.g. Adam's step count, kept on the host beside a GPU's moments
                host = self._host.get((id(param), key))
                if host is None:
                    host = self._host[(id(param), key)] = host_buffer(value, self.device)
                state[key] = host.copy_(value)
        self.released = True

    def restore(self) -> None:
        if not self.released:
            raise RuntimeError("resume_memory called without release_memory")
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                if self._host.get((id(param), key)) is value:
                    state[key] = value.to(param.device, non_blocking=True)
        self.released = False
