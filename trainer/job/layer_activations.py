"""What one decoder layer keeps for backward, per token: the activation term of
`trainer.job.memory_estimate`, by the path the trainer computes the layer with.

The torch backend's layer is transformers' Qwen3 decoder layer (RMSNorm computed in float32,
q and k norms, grouped-query attention through SDPA's fused kernel, a gated SiLU MLP) with
LoRA on its linear layers, computed in bf16 under autocast. What it saves was counted on the CPU
(`torch.autograd.graph.saved_tensors_hooks`; each storage once, parameters left out; the
difference of one and two layers, and of two sequence lengths) at widths varied one at a time.
Every count is a sum of whole widths, in bytes per token in 16-bit:

=====================  ======  =====  =========  ===  ====================================
path                   hidden  query  key-value  MLP  and
=====================  ======  =====  =========  ===  ====================================
eager, PEFT's LoRA         18     10          8    8  2 x rank per adapted linear
eager, merged policy       12      8          8    8
compiled, PEFT's LoRA       8      8          6    6  2 x rank per adapted linear
compiled, merged            8      6          6    6
=====================  ======  =====  =========  ===  ====================================

(query: heads x head_dim; key-value: KV heads x head_dim; MLP: its intermediate width), plus
float32 row statistics: per query head the attention's log-sum-exp and the q norm's inverse
RMS, per KV head the k norm's, and the two layer norms' (4 bytes each). Eager, each RMSNorm
keeps a float32 copy of its input (4 bytes a unit) and its output, the projections' input (2);
the MLP its gate, the gate's SiLU, up and their product (8 x MLP); attention the q and k
norms' float32 copies, q, k and v as the fused kernel takes them, and its output. PEFT's branch
keeps the rank-wide output of A and, through autocast's cast of PEFT's float32 upcast, another
16-bit copy of some inputs (counted with every linear layer adapted: fewer targets keep less);
the merged policy (`trainer.backends.torch.merged_policy`) keeps each projection's input alone.
Compiled (``--torch-compile-layers``), Inductor's partitioner recomputes the cheap pointwise
work in backward instead: the norms' float32 copies, SiLU.

At Qwen3-4B's widths, rank 64, compiled and merged this gives 109,864 bytes a token (42.9 x
hidden); run X measured 105,216 more a kept layer than a recomputed one on an H100 (41.1 x
hidden at 8,448 tokens), whose saved input is 2 x hidden: 0.4% apart.

Megatron's layers (Transformer Engine's kernels) are not counted here; they keep Korthikanti et
al. 2022's 34 x hidden ("Reducing Activation Recomputation in Large Transformer Models", without
the attention scores fused attention never stores), derived for a 4 x hidden MLP without a gate.
"""

from __future__ import annotations

from dataclasses import dataclass

ROW_STATISTIC_BYTES = 4  # a float32 per row: log-sum-exp, an RMSNorm's inverse RMS


@dataclass(frozen=True)
class LayerWidths:
    """A decoder layer's widths, and the LoRA on its linear layers."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    lora_rank: int = 0
    adapted_linears: int = 0  # of one layer

    @property
    def query(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class LayerActivations:
    """Bytes per token a decoder layer keeps for backward in 16-bit compute, per unit of each
    width (the module's table); `row_statistics`: the float32 statistics per row too;
    `lora_outputs`: LoRA's rank-wide outputs too."""

    hidden: int
    query: int = 0
    kv: int = 0
    mlp: int = 0
    row_statistics: bool = False
    lora_outputs: bool = False

    def bytes_per_token(self, widths: LayerWidths) -> int:
        size = (
            self.hidden * widths.hidden
            + self.query * widths.query
            + self.kv * widths.kv
            + self.mlp * widths.mlp
        )
        if self.row_statistics:
            size += ROW_STATISTIC_BYTES * (2 * widths.heads + widths.kv_heads + 2)
        if self.lora_outputs:
            size += 2 * widths.lora_rank * widths.adapted_linears
        return size


EAGER_PEFT = LayerActivations(18, 10, 8, 8, row_statistics=True, lora_outputs=True)
EAGER_MERGED = LayerActivations(12, 8, 8, 8, row_statistics=True)
COMPILED_PEFT = LayerActivations(8, 8, 6, 6, row_statistics=True, lora_outputs=True)
COMPILED_MERGED = LayerActivations(8, 6, 6, 6, row_statistics=True)
KORTHIKANTI = LayerActivations(34)


def torch_layer(*, compiled: bool, merged: bool) -> LayerActivations:
    """The torch backend's layer: compiled or eager, training the merged policy or PEFT's."""
    if compiled:
        return COMPILED_MERGED if merged else COMPILED_PEFT
    return EAGER_MERGED if merged else EAGER_PEFT
