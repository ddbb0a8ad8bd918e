"""The decode bound: the rollout tokens/s the device's HBM bandwidth allows when every decode
step reads all weights (and LoRA's) once and each sequence's KV cache so far, the figure the
benchmarks report each rollout's throughput against."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.workload import Spec

# HBM bandwidth (TB/s, the data sheets') of the accelerators the decode bound knows, by a pattern
# of the name torch reports ("NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"); first match wins:
# the PCIe and NVL H100s differ from the SXM one.
HBM_TBPS = (
    ("H100 PCIe", 2.0),
    ("H100 NVL", 3.9),
    ("H100", 3.35),
    ("H200", 4.8),
    ("B200", 8.0),
    ("MI300X", 5.3),
    ("MI325X", 6.0),
    ("MI35[05]X", 8.0),
)


def device_hbm_tbps(device_name: str) -> float | None:
    """The HBM bandwidth of the accelerator torch names `device_name`, None if unknown."""
    return next((tbps for pattern, tbps in HBM_TBPS if re.search(pattern, device_name)), None)


def bound_bandwidth(given: float | None, device_name: str) -> tuple[float | None, str]:
    """The bandwidth the decode bound uses (`given`, ``--hbm-tbps``, else the device's) and
    where it comes from, for the report."""
    if given is not None:
        return given, f"{given} TB/s (--hbm-tbps)"
    found = device_hbm_tbps(device_name)
    if found is None:
        return None, f"unknown for {device_name}: pass --hbm-tbps"
    return found, f"{found} TB/s ({device_name})"


def decode_bound(spec: Spec, hbm_tbps: float, params: int, lora_params: int) -> float:
    """Tokens/s the decode of one rollout cannot exceed at `hbm_tbps`: every decode step reads
    all weights (bf16) and LoRA weights once, and each sequence's KV cache so far (in
    `spec.kv_cache_dtype`'s format)."""
    shape = spec.model_shape
    kv_per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"]
    kv_per_token *= shape["head_dim"] * spec.kv_element_bytes  # K and V
    rows = spec.prompts * spec.samples
    weights = 2 * (params + lora_params)
    mean_context = spec.prompt_len + spec.response_len / 2
    seconds_per_step = (weights + rows * mean_context * kv_per_token) / (hbm_tbps * 1e12)
    return rows / seconds_per_step


def projection_shapes(spec: Spec) -> dict[str, tuple[int, int]]:
    """(in features, out features) of the seven projections of each of the model's layers."""
    s = spec.model_shape
    hidden, inter = s["hidden_size"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    return {
        "self_attn.q_proj": (hidden, q), "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv), "self_attn.o_proj": (q, hidden),
        "mlp.gate_proj": (hidden, inter), "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }  # fmt: skip


def count_params(spec: Spec) -> tuple[int, int]:
    """(base parameters, LoRA r=64 parameters on the seven projections of every layer)."""
    s = spec.model_shape
    hidden, layers = s["hidden_size"], s["num_hidden_layers"]
    shapes = projection_shapes(spec).values()
    lora = layers * sum(64 * (fan_in + fan_out) for fan_in, fan_out in shapes)
    norms = 2 * s["head_dim"] + 2 * hidden  # q and k norms, the two layer norms
    per_layer = sum(fan_in * fan_out for fan_in, fan_out in shapes) + norms
    return layers * per_layer + s["vocab_size"] * hidden + hidden, lora
