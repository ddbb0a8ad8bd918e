"""Slimming profiles: which members of which wheels a recipe never uses.

A pattern ending in `/` drops a folder; any other pattern is an `fnmatch` glob over the member's
path inside the wheel. `strip` runs `strip --strip-unneeded` on the wheel's shared libraries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    drop: tuple[str, ...] = ()
    strip: bool = False


# SGLang's Triton attention + Triton LoRA path with sampling_backend=pytorch on Hopper: none of
# it loads FlashAttention-3, FlashMLA, InfLLM or the sm100 kernels, FlashInfer's CUTLASS/CCCL
# headers (JIT sources), SGLang's multimodal generation or gRPC cores, the CUDA 12 hook modes of
# torch_memory_saver, or jedi's bundled stubs (IPython completion only).
SGLANG_TRITON: dict[str, Rule] = {
    "sglang-kernel": Rule(
        drop=(
            "sgl_kernel/flash_ops.abi3.so",
            "sgl_kernel/flashmla_ops.abi3.so",
            "sgl_kernel/infllm_ops*",
            "sgl_kernel/sm100/",
        ),
        strip=True,
    ),
    "sglang": Rule(
        drop=(
            "sglang/multimodal_gen/",
            "sglang/srt/grpc/_core*",
            "sglang/srt/server/_core*",
            "sglang/srt/multimodal/_core*",
        )
    ),
    "flashinfer-python": Rule(drop=("flashinfer/data/cutlass/", "flashinfer/data/cccl/")),
    "torch-memory-saver": Rule(
        drop=(
            "torch_memory_saver_hook_mode_*_cu12.abi3.so",
            "torch_memory_saver_hook_mode_preload.abi3.so",
            "torch_memory_saver_hook_mode_torch.abi3.so",
        )
    ),
    "xgrammar": Rule(drop=("xgrammar/lib/",), strip=True),
    "jedi": Rule(drop=("jedi/third_party/typeshed/", "jedi/third_party/django-stubs/")),
}

# The CUDA recipe's FlashInfer attention JIT-compiles its kernels on the node with FlashInfer's
# bundled CUTLASS and CCCL headers: the Triton profile without that one rule.
SGLANG_CUDA: dict[str, Rule] = {
    name: rule for name, rule in SGLANG_TRITON.items() if name != "flashinfer-python"
}

# SGLang's default attention on Hopper, FlashAttention-3 (`attention_backend="fa3"`; it decodes
# an e4m3 KV cache with FP8 queries), beside the CUDA recipe's path: FA3's kernels for sm80, sm86
# and sm90a in one library (1,070 MiB, 326 MiB compressed).
SGLANG_FA3: dict[str, Rule] = {
    **SGLANG_CUDA,
    "sglang-kernel": Rule(
        drop=tuple(
            p for p in SGLANG_TRITON["sglang-kernel"].drop if p != "sgl_kernel/flash_ops.abi3.so"
        ),
        strip=True,
    ),
}

# vLLM's offline `LLM` (TRL's colocated generation) for a dense model on Hopper: FlashAttention 2
# serves SM90 only for ALiBi or an explicit `flash_attn_version=2` (FA3 otherwise) and is imported
# behind an ImportError guard; the MoE kernels (routing top-k, MoE align/permute/GEMM) load under
# `contextlib.suppress(ImportError)`; `vllm-rs` is the Rust HTTP frontend of `vllm serve`.
# FlashInfer is only imported there (its headers serve JIT compiles that path never makes).
VLLM_SM90: dict[str, Rule] = {
    "flashinfer-python": SGLANG_TRITON["flashinfer-python"],
    "vllm": Rule(
        drop=(
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
            "vllm/_moe_C_stable_libtorch.abi3.so",
            "vllm/vllm-rs",
        )
    ),
}

PROFILES: dict[str, dict[str, Rule]] = {
    "sglang-triton": SGLANG_TRITON,
    "sglang-cuda": SGLANG_CUDA,
    "sglang-fa3": SGLANG_FA3,
    "vllm-sm90": VLLM_SM90,
}


def rules_for(profiles: list[str]) -> dict[str, Rule]:
    """The rules of the named profiles merged per (normalised) distribution name."""
    merged: dict[str, Rule] = {}
    for name in profiles:
        for dist, rule in PROFILES[name].items():
            old = merged.get(dist, Rule())
            merged[dist] = Rule(old.drop + rule.drop, old.strip or rule.strip)
    return merged
