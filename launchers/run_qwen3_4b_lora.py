"""Qwen3-4B GRPO LoRA on NVIDIA H100 / H200 / B200 (Megatron-Bridge training, SGLang rollout).

The CUDA twin of launchers/amd/run_qwen3_4b_lora.py: the same recipe
(launchers/recipes/qwen3_4b_lora.py), with SGLang backends chosen for NVIDIA GPUs. CUDA needs
no platform environment beyond Ray's defaults (harness.platform).

    python -m launchers.run_qwen3_4b_lora prepare
    python -m launchers.run_qwen3_4b_lora train --hardware H200
    python -m launchers.run_qwen3_4b_lora full-train --dry-run
"""

from __future__ import annotations

from harness.cli import main
from launchers.recipes import qwen3_4b_lora as recipe

# Attention: FlashInfer runs on Hopper (H100, H200) and Blackwell (B200); FA3 would be
# Hopper-only. LoRA: csgmv, SGLang's chunked-SGMV kernels, added as a faster LoRA backend than
# triton (sgl-project/sglang#10286). Both are values of SGLang's ServerArgs choices
# (ATTENTION_BACKEND_CHOICES, LORA_BACKEND_CHOICES in python/sglang/srt/server_args.py; see
# https://docs.sglang.io/advanced_features/lora.html).
SGLANG = recipe.SGLangBackends(attention="flashinfer", lora="csgmv")

LAUNCHER = recipe.launcher(
    __name__,
    hardware=("H100", "H200", "B200"),
    recorded_hardware="H200",
    sglang=SGLANG,
    wandb_project="qwen3-4b-lora-cuda",
    evidence=(
        "snapshots, argv contract; its live `train`, shortened to 1x H200 (0.6B Qwen3-shaped "
        "model, SGLang 0.5.17 with Triton attention and LoRA, PyTorch + PEFT in place of "
        "Megatron-Bridge, colocated): 12 rollouts, rollout/train log-prob abs diff 0.0073 "
        "mean, the engine's log-probs match the trainer's after every update (max 0.0197), "
        "6.3 s/step (`cuda_gpu` test, 2026-12-03). With Megatron-Bridge training and the "
        "recipe's FlashInfer/csgmv backends (2026-12-04): 12 rollouts with an interrupt and "
        "resume, log-prob abs diff 0.0076, engine vs trainer after every update 0.0098 at most, "
        "4.5 s/step; Qwen3-4B shape at 8,192-token responses, 2 rollouts each with "
        "Megatron-Bridge (238-253 s/step, peak 75.5 GiB) and with PyTorch + PEFT (246-260 "
        "s/step, peak 75.3 GiB) (docs/backends.md)"
    ),
)

if __name__ == "__main__":
    main(LAUNCHER)
