"""A LoRA adapter folded into its base model's linear weights, for ``--lora-serving merged``.

Served through an adapter, every adapted projection of every decode step runs the engine's LoRA
kernels beside the base matrix multiplication; served merged, the engine runs the plain model
with ``W' = W + scaling * B @ A`` in place of each adapted ``W`` (what TRL does for vLLM). The
engine keeps the base ``W`` of the adapted layers (read once from the checkpoint, in the
engine's dtype, so it equals the trainer's frozen base), and each update computes every ``W'``
in float32 and rounds it once to that dtype: the merged weights never drift from repeated
merging and unmerging. ``scaling`` is PEFT's: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)``
with rsLoRA.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.backends.base import LoraAdapter
from trainer.backends.devices import empty_cache, host_copies
from trainer.backends.flat_tensors import FlatTensors

if TYPE_CHECKING:
    import torch

PEFT_PREFIX = "base_model.model."
LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


class MergeError(ValueError):
    """An adapter that cannot be merged into this base."""


@dataclass(frozen=True)
class LoraLayer:
    """One adapted linear layer, by its module path in the base model (Hugging Face names)."""

    module: str

    @property
    def weight(self) -> str:
        """The base's weight name."""
        return f"{self.module}.weight"

    @property
    def a(self) -> str:
        """The adapter's key of the layer's A matrix."""
        return f"{PEFT_PREFIX}{self.module}{LORA_A}"

    @property
    def b(self) -> str:
        """The adapter's key of the layer's B matrix."""
        return f"{PEFT_PREFIX}{self.module}{LORA_B}"


def adapts(name: str, shape: Sequence[int], targets: Collection[str]) -> bool:
    """Whether LoRA on the modules `targets` adapts the checkpoint tensor `name` of `shape`: a
    2-D weight of a module whose own name is a target, as PEFT matches ``target_modules``."""
    return len(shape) == 2 and name.endswith(".weight") and name.split(".")[-2] in targets


def checkpoint_shapes(path: str | Path) -> Iterator[tuple[str, list[int]]]:
    """(name, shape) of every tensor in the checkpoint's ``*.safetensors`` files, from their
    headers alone."""
    from safetensors import safe_open

    for file in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as tensors:
            for name in tensors.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                yield name, list(tensors.get_slice(name).get_shape())


def adapted_weights(path: str | Path, targets: Collection[str]) -> list[str]:
    """The names of the checkpoint's weights that LoRA on `targets` adapts (`adapts`)."""
    return [name for name, shape in checkpoint_shapes(path) if adapts(name, shape, targets)]


def lora_layers(names: Iterable[str]) -> tuple[LoraLayer, ...]:
    """The adapted layers of an adapter with these PEFT state-dict keys, in key order."""
    modules: dict[str, set[str]] = {}
    for name in names:
        suffix = LORA_A if name.endswith(LORA_A) else LORA_B if name.endswith(LORA_B) else None
        if suffix is None or not name.startswith(PEFT_PREFIX):
            raise MergeError(f"adapter tensor {name!r} is not a PEFT LoRA A or B matrix")
        modules.setdefault(name[len(PEFT_PREFIX) : -len(suffix)], set()).add(suffix)
    unpaired = [module for module, found in modules.items() if len(found) != 2]
    if unpaired:
        raise MergeError(f"adapter has only one of A and B for {unpaired[0]}")
    return tuple(LoraLayer(module) for module in modules)


def lora_scaling(config: Mapping[str, Any]) -> float:
    """PEFT's scaling of ``B @ A`` for an adapter config (``adapter_config.json`` as a dict)."""
    for field in ("rank_pattern", "alpha_pattern"):
        if config.get(field):
            raise MergeError(f"adapter config has a {field}: per-module ranks are not merged")
    if config.get("use_dora"):
        raise MergeError("DoRA adapters are not merged (their magnitude vector rescales W)")
    rank, alpha = config["r"], config["lora_alpha"]
    return alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank


def merged_weight(
    base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """``base + scaling * b @ a`` computed in float32, in `base`'s dtype. The product is full
    float32 whatever the process allows for float32 matrix products (TF32 after
    ``torch.set_float32_matmul_precision("high")``, bf16 passes after ``"medium"``): the engine's
    merge and the trainer's (`merged_policy`) must round to the same weights bit for bit."""
    import torch

    with full_float32_matmuls():
        return torch.addmm(base.float(), b.float(), a.float(), alpha=scaling).to(base.dtype)


@contextmanager
def full_float32_matmuls() -> Iterator[None]:
    """Float32 matrix products at full precision inside the block; the process's setting is
    restored after it."""
    import torch

    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


class LoraMerger:
    """Merges adapters into the base weights of their layers. `load_base(names)` returns the
    base weights of those names (``model.layers.0.self_attn.q_proj.weight``, ...) in `dtype`;
    they are read on the first merge and kept on `device`, unless `borrow` gave them."""

    def __init__(
        self,
        load_base: Callable[[list[str]], Mapping[str, torch.Tensor]],
        device: Any,
        dtype: torch.dtype,
    ) -> None:
        self._load_base = load_base
        self.device = device
        self.dtype = dtype
        self.base: dict[str, torch.Tensor] = {}
        self.host: dict[str, torch.Tensor] = {}  # their host copies (`keep_on_host`, `release`)

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: Any, dtype: torch.dtype) -> LoraMerger:
        return cls(lambda names: read_weights(Path(path), names, dtype), device, dtype)

    def borrow(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Merge into `weights` (another holder's tensors, on this merger's device, in its
        dtype: the trainer's frozen base, `shared_base`) in place of reading those names."""
        import torch

        device = torch.device(self.device)  # with its index, as the backends name devices
        for name, weight in weights.items():
            if weight.device != device or weight.dtype != self.dtype:
                raise MergeError(
                    f"the base weight {name} lent to the merge is {weight.dtype} on "
                    f"{weight.device}; the merge needs {self.dtype} on {device}"
                )
        self.base.update(weights)

    def keep_on_host(self, names: Iterable[str]) -> None:
        """Read the base weights `names` from the checkpoint straight into their host copies
        (pinned on a GPU), for a merger whose base leaves the device between merges
        (`release`, `restore`): the first merge then restores them as every later one does.
        Left to the first merge, reading the checkpoint onto the device and copying it back to
        newly pinned memory fell in a training step: the first update took 6.0 s at the
        Qwen3-4B shape on an H100, 0.27 s with the base read here (runs N and Q)."""
        wanted = [name for name in names if name not in self.host]
        self.host.update(host_copies(self._load_base(wanted), self.device))

    def release(self) -> None:
        """Gives back the device memory of the base weights kept for merging, while a
        colocated engine's GPU goes to the trainer. Their host copy is made once (pinned on a
        GPU, so that `restore` copies asynchronously) and kept: no device-to-host copy after
        the first release."""
        new = {name: weight for name, weight in self.base.items() if name not in self.host}
        if new:
            self.host.update(host_copies(new, self.device))
        self.base = {}
        empty_cache(self.device)

    def restore(self) -> None:
        """The kept base weights back on the device after `release`."""
        self.base = {
            name: weight.to(self.device, non_blocking=True) for name, weight in self.host.items()
        }

    def merge(self, adapter: LoraAdapter) -> FlatTensors:
        """The merged weights of every layer `adapter` covers, in one buffer on the device."""
        layers = lora_layers(adapter.tensors)
        scaling = lora_scaling(adapter.config)
        missing = [layer.weight for layer in layers if layer.weight not in self.base]
        if missing:
            loaded = self._load_base(missing)
            self.base.update({name: w.to(self.device) for name, w in loaded.items()})
        merged = FlatTensors.allocate(
            ((layer.weight, self.base[layer.weight].dtype, tuple(self.base[layer.weight].shape))
             for layer in layers),
            device=self.device,
        )  # fmt: skip
        for layer in layers:
            a = adapter.tensors[layer.a].to(self.device, non_blocking=True)
            b = adapter.tensors[layer.b].to(self.device, non_blocking=True)
            base = self.base[layer.weight]
            if (b.shape[0], a.shape[1]) != tuple(base.shape):
                raise MergeError(
                    f"{layer.module}: adapter B @ A is {b.shape[0]}x{a.shape[1]}, the base "
                    f"weight {tuple(base.shape)}"
                )
            merged[layer.weight].copy_(merged_weight(base, a, b, scaling))
        return merged


def read_weights(path: Path, names: Iterable[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Tensors `names` of the checkpoint at `path` (its ``*.safetensors`` files), in `dtype`."""
    from safetensors import safe_open

    wanted = set(names)
    found: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as tensors:
            for name in wanted.intersection(tensors.keys()):
                found[name] = tensors.get_tensor(name).to(dtype)
    missing = sorted(wanted - found.keys())
    if missing:
        raise MergeError(f"{path} has no weight {missing[0]} for the adapter to merge into")
    return found
