"""The PEFT trainer's policy under ``--lora-serving merged``: the base with every adapted
weight replaced by the merged weight the engines serve.

Merged serving rounds ``W + scaling * B @ A`` to the engines' dtype (`lora_merge`); in bf16 most
of a small update is below that rounding step, so a trainer computing ``W x + scaling * B A x``
would train a policy the engines never sample from. Here the trainer computes exactly the served
weights instead: each adapted layer's base ``Linear`` is replaced by a `MergedLinear` holding the
same weight and bias, which computes with `lora_merge.merged_weight` of the frozen base and the
adapter's A and B rounded as the trainer exports them, and PEFT's own LoRA branch is switched
off (PEFT's ``enable_adapters(False)``: the layer then computes its base layer alone).

The gradient reaches A and B straight through the rounding: with ``dW = dY^T X`` the weight's
gradient, ``dA = scaling * B^T dW`` and ``dB = scaling * dW A^T``: LoRA's gradient wherever the
rounding changes nothing. `MergedLinearFunction` computes them as LoRA does, low-rank
(``scaling * (dY B)^T X`` and ``scaling * dY^T (X A^T)``), without ever forming ``dW``.

Outside `MergedPolicy.weights_kept` each layer merges in every pass (forward, its recompute
under gradient checkpointing, backward) and keeps no merged copy; inside it each layer merges
once, before the block, and every pass of the block computes with that copy. The trainer opens
the block around each optimizer step's passes and each log-probability pass with the adapter
(unless ``--no-keep-merged-weights``): one merge per layer per step instead of two or three per
micro-batch, for one more copy of the adapted weights in the training dtype while the step
runs, and no merge inside a compiled layer (``--torch-compile-layers``), whose graph it would
break (`lora_merge.full_float32_matmuls`). Both compute the same weights bit for bit.

The saved adapter is the same A and B; merged into the base in the serving dtype it is the
trained policy exactly, applied unmerged (PEFT) it differs from it by that rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from trainer.backends.lora_merge import MergeError, merged_weight
from trainer.backends.torch.targets import unmergeable_layer


def _merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    with torch.autocast(base.device.type, enabled=False):  # float32, as the engines merge
        return merged_weight(base, a, b, scaling)


@dataclass(frozen=True)
class KeptMerge:
    """A layer's merged weight and the A and B it was merged from, all in the compute dtype,
    kept for the passes of one optimizer step (`MergedPolicy.weights_kept`)."""

    weight: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


class MergedLinearFunction(torch.autograd.Function):
    """``x @ W'^T + bias`` with ``W'`` = `merged_weight` of `base` and A, B rounded to
    `dtype`, computed in `dtype`; A's and B's gradients pass both roundings as if they were not
    there (the module's doc). With `kept` (the same A and B merged before), its weight and
    roundings are used and kept for backward instead of merging and rounding again."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        base: torch.Tensor,
        bias: torch.Tensor | None,
        a: torch.Tensor,
        b: torch.Tensor,
        scaling: float,
        dtype: torch.dtype,
        kept: KeptMerge | None,
    ) -> torch.Tensor:
        ctx.dtypes = x.dtype, a.dtype, b.dtype
        x = x.to(dtype)  # (autograd does not record inside)
        if kept is None:
            a, b, weight = a.to(dtype), b.to(dtype), None
        else:
            a, b, weight = kept.a, kept.b, kept.weight
        ctx.save_for_backward(x, base, a, b, weight)
        ctx.scaling = scaling
        with torch.autocast(x.device.type, enabled=False):
            merged = _merge(base, a, b, scaling) if weight is None else weight
            return torch.nn.functional.linear(x, merged, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, base, a, b, weight = ctx.saved_tensors
        x_dtype, a_dtype, b_dtype = ctx.dtypes
        needs_x, _, needs_bias, needs_a, needs_b, _, _, _ = ctx.needs_input_grad
        grad_x = grad_bias = grad_a = grad_b = None
        with torch.autocast(grad.device.type, enabled=False):
            grad = grad.to(x.dtype).reshape(-1, grad.shape[-1])  # [tokens, out]
            rows = x.reshape(-1, x.shape[-1])  # [tokens, in]
            if needs_x:
                if weight is None:
                    weight = _merge(base, a, b, ctx.scaling)
                grad_x = (grad @ weight).to(x_dtype).reshape(*x.shape[:-1], -1)
            if needs_bias:
                grad_bias = grad.sum(0)
            if needs_a:
                grad_a = ((grad @ b).mul_(ctx.scaling).t() @ rows).to(a_dtype)
            if needs_b:
                grad_b = (grad.t() @ (rows @ a.t()).mul_(ctx.scaling)).to(b_dtype)
        return grad_x, None, grad_bias, grad_a, grad_b, None, None, None


class MergedLinear(torch.nn.Module):
    """In place of a PEFT LoRA ``Linear``'s base layer: the base's own weight and bias under
    their names, computing with the merged weight while `merging`, else with the base alone. It
    holds the LoRA layer without registering it as a submodule, so A and B stay PEFT's
    parameters under PEFT's names (the saved and exported adapter)."""

    def __init__(self, layer: Any, adapter: str, dtype: torch.dtype) -> None:
        super().__init__()
        base = layer.get_base_layer()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self._layer = (layer,)
        self.adapter = adapter
        self.dtype = dtype
        self.merging = True
        self.kept: KeptMerge | None = None  # inside `MergedPolicy.weights_kept`

    def _adapter(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        layer, adapter = self._layer[0], self.adapter
        a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        return a, b, layer.scaling[adapter]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.merging:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        a, b, scaling = self._adapter()
        return MergedLinearFunction.apply(
            x, self.weight, self.bias, a, b, scaling, self.dtype, self.kept
        )

    def merge_now(self) -> KeptMerge:
        """The weight this layer computes with while merging, from A and B as they are now."""
        a, b, scaling = self._adapter()
        with torch.no_grad():
            a, b = a.to(self.dtype), b.to(self.dtype)
            return KeptMerge(_merge(self.weight, a, b, scaling), a, b)


class MergedPolicy:
    """Puts every LoRA layer of a PEFT `model` in its merged form (the module's doc); `dtype`:
    the dtype the adapter reaches the engines in."""

    def __init__(self, model: Any, dtype: torch.dtype) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        if problem := unmergeable_layer(model):
            raise MergeError(problem)
        self.layers: dict[str, MergedLinear] = {}  # by the base weight's name
        for name, layer in list(model.get_base_model().named_modules()):  # replacing adds some
            if not isinstance(layer, BaseTunerLayer):
                continue
            (adapter,) = layer.active_adapters
            trainable = [p for p in layer.parameters() if p.requires_grad]
            layer.enable_adapters(False)  # PEFT also stops their gradients: given back below
            for param in trainable:
                param.requires_grad_(True)
            layer.base_layer = MergedLinear(layer, adapter, dtype)
            self.layers[f"{name}.weight"] = layer.base_layer

    @contextmanager
    def base_only(self) -> Iterator[None]:
        """The base model without the adapter (the reference policy) inside the block."""
        for layer in self.layers.values():
            layer.merging = False
        try:
            yield
        finally:
            for layer in self.layers.values():
                layer.merging = True

    @contextmanager
    def weights_kept(self) -> Iterator[None]:
        """Every layer merges at the block's start and computes all the block's passes with
        that copy (the module's doc); the copies are dropped at its end. A and B must not
        change inside the block: it spans the passes between two optimizer steps."""
        for layer in self.layers.values():
            layer.kept = layer.merge_now()
        try:
            yield
        finally:
            for layer in self.layers.values():
                layer.kept = None

    def served(self) -> dict[str, torch.Tensor]:
        """The weights the trainer computes with, under the names the engines' merge gives them
        (``model.layers.0.self_attn.q_proj.weight``, ...)."""
        return {name: layer.merge_now().weight for name, layer in self.layers.items()}

    def base(self) -> dict[str, torch.Tensor]:
        """The frozen base weights of the adapted layers, the model's own tensors, under the
        names `served` gives their merged weights (what an engine merges into,
        `trainer.backends.shared_base`)."""
        return {name: layer.weight.detach() for name, layer in self.layers.items()}
