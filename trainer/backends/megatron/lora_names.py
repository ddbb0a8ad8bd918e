"""LoRA adapter names and layouts between Megatron(-Bridge) and Hugging Face PEFT.

Megatron fuses q/k/v into ``linear_qkv`` and gate/up into ``linear_fc1``; Bridge's LoRA wraps each
fused linear with one adapter (``adapter.linear_in`` = lora_A, ``adapter.linear_out`` = lora_B,
scale alpha/rank like PEFT). PEFT keeps one adapter per projection. Converting is exact: the q, k
and v adapters share the fused lora_A and take their rows of the fused lora_B.

Layouts mirrored from Megatron-Bridge 0.3.1 (``param_mapping.split_qkv_weights``,
``peft_bridge._split_fused_fc1_linear_out_weight``, ``peft/utils.ParallelLinearAdapter``):

* fused qkv rows are interleaved per query group: ``[q heads of group g, k_g, v_g]`` for each g;
* fused fc1 rows are ``[gate; up]``, but under tensor parallelism each rank holds
  ``[gate_r; up_r]``, so gathered shards must be de-interleaved;
* adapters of column-parallel linears (qkv, fc1) shard lora_A along its rank dim (0) and lora_B
  along its output dim (0); adapters of row-parallel linears (proj, fc2) shard lora_A along its
  input dim (1) and lora_B along its output dim (0).

Pure: torch tensors in, torch tensors out; no Megatron import. `resolve_targets` is the one
place where LoRA target modules are resolved, for every backend.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainer.config.flags import split_list

if TYPE_CHECKING:
    import torch

PEFT_PREFIX = "base_model.model."
ALL_LINEAR_ALIASES = ("all-linear", "all_linear", "all")

FUSED_GROUPS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
MEGATRON_MODULES = tuple(FUSED_GROUPS)
HF_MODULES = tuple(name for group in FUSED_GROUPS.values() for name in group)
HF_TO_MEGATRON = {hf: mg for mg, group in FUSED_GROUPS.items() for hf in group}
ROW_PARALLEL = frozenset({"linear_proj", "linear_fc2"})

_MEGATRON_PARENT = {
    "linear_qkv": "self_attention",
    "linear_proj": "self_attention",
    "linear_fc1": "mlp",
    "linear_fc2": "mlp",
}
_HF_PARENT = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}
_MEGATRON_KEY = re.compile(
    r"^decoder\.layers\.(\d+)\.(?:self_attention|mlp)\."
    r"(linear_qkv|linear_proj|linear_fc1|linear_fc2)\.adapter\.(linear_in|linear_out)\.weight$"
)
_HF_KEY = re.compile(
    r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_(A|B)\.weight$"
)
_WRAPPER_PREFIX = re.compile(r"^(?:module\.)+")


class LoraNameError(ValueError):
    """An adapter name, target list or tensor layout that cannot be mapped."""


@dataclass(frozen=True)
class AttentionShape:
    """What splitting the fused qkv needs: heads, KV groups (GQA) and the per-head size."""

    num_attention_heads: int
    num_query_groups: int
    head_dim: int

    def __post_init__(self) -> None:
        if min(self.num_attention_heads, self.num_query_groups, self.head_dim) <= 0:
            raise LoraNameError(f"attention shape must be positive: {self}")
        if self.num_attention_heads % self.num_query_groups:
            raise LoraNameError(
                f"{self.num_attention_heads} attention heads are not divisible into "
                f"{self.num_query_groups} query groups"
            )

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.head_dim

    @classmethod
    def from_hf_config(cls, config: Any) -> AttentionShape:
        """From a transformers config (``head_dim`` may differ from hidden/heads, as in Qwen3)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        groups = getattr(config, "num_key_value_heads", None) or heads
        return cls(heads, groups, head_dim)


@dataclass(frozen=True)
class LoraTargets:
    """Resolved LoRA targets (`resolve_targets`). `widened` lists HF projections added because
    Megatron fuses them with a requested one (asking for q_proj adapts q, k and v)."""

    megatron: tuple[str, ...]
    hf: tuple[str, ...]
    widened: tuple[str, ...]


def _names(spec: str | Sequence[str] | None) -> list[str]:
    """A comma list (as ``--target-modules`` gives it) or a sequence of names."""
    if spec is None or isinstance(spec, str):
        return list(split_list(spec))
    return [item.strip() for item in spec if item.strip()]


def _unknown(name: str, what: str) -> LoraNameError:
    valid = (*HF_MODULES, *MEGATRON_MODULES, "all-linear")
    close = difflib.get_close_matches(name, valid, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; valid: {', '.join(valid)}"
    return LoraNameError(f"unknown LoRA {what} module {name!r}{hint}")


def resolve_targets(
    target_modules: str | Sequence[str],
    exclude_modules: str | Sequence[str] | None = None,
    *,
    fused: bool = True,
) -> LoraTargets:
    """The one resolution of ``--target-modules`` / ``--exclude-modules``.

    `fused` (Megatron): ``all-linear`` and HF or Megatron names expand into Megatron's fused
    modules, and `hf` lists every projection they cover; excluding only part of a fused group
    (``k_proj`` alone) is rejected, since Megatron cannot adapt q and v without k. Unfused (PEFT):
    `hf` is exactly the listed projections (``all-linear``: the seven of a decoder layer) less the
    excluded ones, and `megatron` is empty.
    """
    requested = _names(target_modules)
    if not requested:
        raise LoraNameError("no LoRA target modules given")
    excluded = _names(exclude_modules)
    if not fused:
        listed = HF_MODULES if any(m in ALL_LINEAR_ALIASES for m in requested) else requested
        return LoraTargets(
            megatron=(), hf=tuple(m for m in listed if m not in excluded), widened=()
        )
    megatron: set[str] = set()
    asked_hf: set[str] = set()
    for name in requested:
        if name in ALL_LINEAR_ALIASES:
            megatron.update(MEGATRON_MODULES)
            asked_hf.update(HF_MODULES)
        elif name in HF_TO_MEGATRON:
            megatron.add(HF_TO_MEGATRON[name])
            asked_hf.add(name)
        elif name in FUSED_GROUPS:
            megatron.add(name)
            asked_hf.update(FUSED_GROUPS[name])
        else:
            raise _unknown(name, "target")
    for name in excluded:
        if name in FUSED_GROUPS:
            megatron.discard(name)
        elif name in HF_TO_MEGATRON:
            group = HF_TO_MEGATRON[name]
            members = FUSED_GROUPS[group]
            if group in megatron and not set(members) <= set(excluded):
                together = ",".join(members)
                raise LoraNameError(
                    f"cannot exclude {name} alone: Megatron fuses {together} into {group}; "
                    f"exclude {together} together"
                )
            megatron.discard(group)
        else:
            raise _unknown(name, "exclude")
    if not megatron:
        raise LoraNameError("every LoRA target module is excluded")
    ordered = tuple(m for m in MEGATRON_MODULES if m in megatron)
    hf = tuple(h for m in ordered for h in FUSED_GROUPS[m])
    widened = tuple(h for h in hf if h not in asked_hf)
    return LoraTargets(megatron=ordered, hf=hf, widened=widened)


def strip_wrappers(name: str) -> str:
    """Drop the ``module.`` prefixes that DDP / Float16Module wrappers add."""
    return _WRAPPER_PREFIX.sub("", name)


def parse_megatron_key(name: str) -> tuple[int, str, str] | None:
    """``(layer, module, linear_in|linear_out)`` of a Megatron adapter parameter, else None."""
    match = _MEGATRON_KEY.match(strip_wrappers(name))
    return None if match is None else (int(match[1]), match[2], match[3])


def megatron_key(layer: int, module: str, which: str) -> str:
    return f"decoder.layers.{layer}.{_MEGATRON_PARENT[module]}.{module}.adapter.{which}.weight"


def peft_key(layer: int, projection: str, which: str) -> str:
    """PEFT state-dict name (adapter name stripped, as in ``adapter_model.safetensors``)."""
    parent = _HF_PARENT[projection]
    return f"{PEFT_PREFIX}model.layers.{layer}.{parent}.{projection}.lora_{which}.weight"


def parse_peft_key(name: str) -> tuple[int, str, str]:
    """``(layer, projection, A|B)``; accepts names with or without the ``base_model.model.``
    prefix (Bridge's exporter yields them without)."""
    bare = name.removeprefix(PEFT_PREFIX)
    match = _HF_KEY.match(bare)
    if match is None:
        raise LoraNameError(f"not a supported PEFT LoRA tensor name: {name!r}")
    return int(match[1]), match[2], match[3]


def _qkv_row_groups(attention: AttentionShape) -> tuple[list[int], list[int], list[int]]:
    size, hpg = attention.head_dim, attention.heads_per_group
    q: list[int] = []
    k: list[int] = []
    v: list[int] = []
    for group in range(attention.num_query_groups):
        base = group * (hpg + 2) * size
        q.extend(range(base, base + hpg * size))
        k.extend(range(base + hpg * size, base + (hpg + 1) * size))
        v.extend(range(base + (hpg + 1) * size, base + (hpg + 2) * size))
    return q, k, v


def split_qkv_lora_b(
    lora_b: torch.Tensor, attention: AttentionShape
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused (interleaved) qkv lora_B ``[qkv_rows, r]`` -> q, k, v lora_B."""
    if lora_b.shape[0] != attention.qkv_rows:
        raise LoraNameError(
            f"fused qkv lora_B has {lora_b.shape[0]} rows, expected {attention.qkv_rows} "
            f"for {attention}"
        )
    q, k, v = _qkv_row_groups(attention)
    return lora_b[q].clone(), lora_b[k].clone(), lora_b[v].clone()


def merge_qkv_lora_b(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention: AttentionShape
) -> torch.Tensor:
    """Inverse of `split_qkv_lora_b`."""
    import torch

    rank = q.shape[1]
    size, hpg, groups = attention.head_dim, attention.heads_per_group, attention.num_query_groups
    expected = (attention.num_attention_heads * size, groups * size, groups * size)
    if (q.shape[0], k.shape[0], v.shape[0]) != expected:
        raise LoraNameError(
            f"q/k/v lora_B rows {(q.shape[0], k.shape[0], v.shape[0])} do not match {attention}"
        )
    fused = torch.cat(
        [
            q.reshape(groups, hpg * size, rank),
            k.reshape(groups, size, rank),
            v.reshape(groups, size, rank),
        ],
        dim=1,
    )
    return fused.reshape(attention.qkv_rows, rank)


def megatron_to_peft(
    state: Mapping[str, torch.Tensor], attention: AttentionShape, *, layer_offset: int = 0
) -> dict[str, torch.Tensor]:
    """Full (TP-gathered) Megatron adapter tensors -> PEFT tensors.

    `layer_offset` turns a pipeline stage's local layer numbers into global ones.
    """
    grouped: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        parsed = parse_megatron_key(name)
        if parsed is None:
            raise LoraNameError(f"not a supported Megatron LoRA parameter: {name!r}")
        layer, module, which = parsed
        grouped.setdefault((layer + layer_offset, module), {})[which] = tensor
    out: dict[str, torch.Tensor] = {}
    for (layer, module), pair in sorted(grouped.items()):
        if set(pair) != {"linear_in", "linear_out"}:
            raise LoraNameError(
                f"layer {layer} {module}: adapter needs both linear_in and linear_out"
            )
        lora_a, lora_b = pair["linear_in"], pair["linear_out"]
        if module == "linear_qkv":
            parts = split_qkv_lora_b(lora_b, attention)
        elif module == "linear_fc1":
            if lora_b.shape[0] % 2:
                raise LoraNameError(f"layer {layer} linear_fc1 lora_B has an odd row count")
            parts = tuple(part.clone() for part in lora_b.chunk(2, dim=0))
        else:
            parts = (lora_b,)
        for projection, part in zip(FUSED_GROUPS[module], parts, strict=True):
            out[peft_key(layer, projection, "A")] = lora_a.clone()
            out[peft_key(layer, projection, "B")] = part
    return out


def peft_to_megatron(
    state: Mapping[str, torch.Tensor], attention: AttentionShape
) -> dict[str, torch.Tensor]:
    """PEFT tensors -> full Megatron adapter tensors (global layer numbers).

    The projections of a fused group must share one lora_A, as adapters exported by
    `megatron_to_peft` do; an adapter trained with independent q/k/v lora_A cannot be fused.
    """
    import torch

    grouped: dict[tuple[int, str], dict[tuple[str, str], torch.Tensor]] = {}
    for name, tensor in state.items():
        layer, projection, which = parse_peft_key(name)
        grouped.setdefault((layer, HF_TO_MEGATRON[projection]), {})[(projection, which)] = tensor
    out: dict[str, torch.Tensor] = {}
    for (layer, module), parts in sorted(grouped.items()):
        members = FUSED_GROUPS[module]
        missing = [f"{p}.lora_{w}" for p in members for w in "AB" if (p, w) not in parts]
        if missing:
            raise LoraNameError(
                f"layer {layer}: {module} needs {', '.join(missing)} (Megatron fuses "
                f"{', '.join(members)})"
            )
        lora_a = parts[(members[0], "A")]
        if any(not torch.equal(parts[(p, "A")], lora_a) for p in members[1:]):
            raise LoraNameError(
                f"layer {layer}: {', '.join(members)} have different lora_A; Megatron's fused "
                f"{module} shares one lora_A"
            )
        b = [parts[(p, "B")] for p in members]
        if module == "linear_qkv":
            lora_b = merge_qkv_lora_b(*b, attention)
        elif module == "linear_fc1":
            lora_b = torch.cat(b, dim=0)
        else:
            lora_b = b[0]
        out[megatron_key(layer, module, "linear_in")] = lora_a.clone()
        out[megatron_key(layer, module, "linear_out")] = lora_b.clone()
    return out


def tp_shard_dim(module: str, which: str) -> int:
    """Dimension along which tensor parallelism shards an adapter weight."""
    return 1 if which == "linear_in" and module in ROW_PARALLEL else 0


def gather_tp_shards(module: str, which: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-TP-rank adapter shards (rank order) -> the TP=1 tensor."""
    import torch

    if module == "linear_fc1" and which == "linear_out" and len(shards) > 1:
        halves = [shard.chunk(2, dim=0) for shard in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=tp_shard_dim(module, which))


def shard_for_tp(
    module: str, which: str, full: torch.Tensor, tp_size: int, tp_rank: int
) -> torch.Tensor:
    """The TP=1 tensor -> this rank's shard (inverse of `gather_tp_shards`)."""
    import torch

    dim = tp_shard_dim(module, which)
    if full.shape[dim] % tp_size:
        raise LoraNameError(
            f"{module}.{which}: size {full.shape[dim]} on dim {dim} is not divisible by "
            f"TP {tp_size}"
        )
    if module == "linear_fc1" and which == "linear_out" and tp_size > 1:
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size)[tp_rank], up.chunk(tp_size)[tp_rank]], dim=0).clone()
    return full.chunk(tp_size, dim=dim)[tp_rank].clone()


def peft_config(
    targets: LoraTargets, *, rank: int, alpha: float, dropout: float, base_model: str
) -> dict[str, Any]:
    """The ``adapter_config.json`` content PEFT and SGLang read for this adapter."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": list(targets.hf),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
    }
