"""The PEFT trainer's policy under ``--lora-serving merged``: the base with every adapted
weight replaced by the merged weight the engines serve.

Merged serving rounds ``W + scaling * B @ A`` to the engines' dtype (`lora_merge`); in bf16 most
of a small update is below that rounding step, so a trainer computing ``W x + scaling * B A x``
would train a policy the engines never sample from. Here the trainer computes exactly the served
weights instead: each adapted layer's base weight is parametrized
(``torch.nn.utils.parametrize``) as `lora_merge.merged_weight` of the frozen base and the
adapter's A and B rounded as the trainer exports them, and PEFT's own LoRA branch is switched off
(PEFT's ``enable_adapters(False)``: the layer then computes its base layer alone). The gradient
reaches A and B straight through the rounding, ``dA = scaling * B^T dW`` and
``dB = scaling * dW A^T``: LoRA's gradient wherever the rounding changes nothing. The saved
adapter is the same A and B; merged into the base in the serving dtype it is the trained policy
exactly, applied unmerged (PEFT) it differs from it by that rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from trainer.backends.lora_merge import MergeError, merged_weight
from trainer.backends.peft_targets import unmergeable_layer


class StraightThroughMerge(torch.autograd.Function):
    """`merged_weight` of `base` and A, B rounded to `dtype`; the gradient passes both
    roundings as if they were not there."""

    @staticmethod
    def forward(
        ctx: Any,
        base: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        scaling: float,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        a, b = a.to(dtype), b.to(dtype)  # (autograd does not record inside forward)
        ctx.save_for_backward(a, b)
        ctx.scaling = scaling
        with torch.autocast(base.device.type, enabled=False):  # float32, as the engines merge
            return merged_weight(base, a, b, scaling)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b = ctx.saved_tensors
        with torch.autocast(grad.device.type, enabled=False):
            grad = grad.float()
            grad_a = torch.mm(b.float().t(), grad).mul_(ctx.scaling)
            grad_b = torch.mm(grad, a.float().t()).mul_(ctx.scaling)
        return None, grad_a, grad_b, None, None


class MergedWeight(torch.nn.Module):
    """The parametrization of one PEFT LoRA ``Linear``'s base weight: the merged weight while
    `merging`, else the base itself. It holds the layer without registering it as a submodule,
    so A and B stay PEFT's parameters under PEFT's names (the saved and exported adapter)."""

    def __init__(self, layer: Any, adapter: str, dtype: torch.dtype) -> None:
        super().__init__()
        self._layer = (layer,)
        self.adapter = adapter
        self.dtype = dtype
        self.merging = True

    @property
    def layer(self) -> Any:
        """The PEFT LoRA layer whose base weight this is."""
        return self._layer[0]

    def forward(self, base: torch.Tensor) -> torch.Tensor:
        if not self.merging:
            return base
        layer, adapter = self.layer, self.adapter
        a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        return StraightThroughMerge.apply(base, a, b, layer.scaling[adapter], self.dtype)


class MergedPolicy:
    """Puts every LoRA layer of a PEFT `model` in its merged form (the module's doc); `dtype`:
    the dtype the adapter reaches the engines in."""

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer
        from torch.nn.utils import parametrize

        if problem := unmergeable_layer(model):
            raise MergeError(problem)
        self.weights: dict[str, MergedWeight] = {}  # by the base weight's name
        for name, layer in list(model.get_base_model().named_modules()):  # registering adds some
            if not isinstance(layer, BaseTunerLayer):
                continue
            (adapter,) = layer.active_adapters
            trainable = [p for p in layer.parameters() if p.requires_grad]
            layer.enable_adapters(False)  # PEFT also stops their gradients: given back below
            for param in trainable:
                param.requires_grad_(True)
            weight = MergedWeight(layer, adapter, dtype)
            parametrize.register_parametrization(layer.get_base_layer(), "weight", weight)
            self.weights[f"{name}.weight"] = weight

    @contextmanager
    def base_only(self) -> Iterator[None]:
        """The base model without the adapter (the reference policy) inside the block."""
        for weight in self.weights.values():
            weight.merging = False
        try:
            yield
        finally:
            for weight in self.weights.values():
                weight.merging = True

    def served(self) -> dict[str, torch.Tensor]:
        """The weights the trainer computes with, under the names the engines' merge gives them
        (``model.layers.0.self_attn.q_proj.weight``, ...)."""
        with torch.no_grad():
            return {
                name: weight.layer.get_base_layer().weight for name, weight in self.weights.items()
            }
