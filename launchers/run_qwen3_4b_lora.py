"""Qwen3-4B GRPO LoRA on NVIDIA H100 / H200 / B200 (Megatron-Bridge training, SGLang rollout).

The CUDA twin of launchers/amd/run_qwen3_4b_lora.py: the same recipe
(launchers/recipes/qwen3_4b.py), with SGLang backends chosen for NVIDIA GPUs. CUDA needs no
platform environment beyond Ray's defaults (harness.platform).

    python -m launchers.run_qwen3_4b_lora prepare
    python -m launchers.run_qwen3_4b_lora train --hardware H200
    python -m launchers.run_qwen3_4b_lora full-train --dry-run
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness import LauncherArgs, arg
from harness.cli import main
from launchers.recipes import qwen3_4b as recipe

# Attention: FlashInfer runs on Hopper (H100, H200) and Blackwell (B200); FA3 would be
# Hopper-only. LoRA: csgmv, SGLang's chunked-SGMV kernels, faster than triton
# (sgl-project/sglang#10286). Both are values of SGLang's ServerArgs choices
# (https://docs.sglang.io/advanced_features/lora.html).
SGLANG = recipe.SGLangBackends(attention="flashinfer", lora="csgmv")
# The rollout and trainer environments of docs/backends.md (PyPI's torch 2.11.0 is a CUDA build).
PACKAGES = recipe.Packages(
    constraints=("constraints/cuda-sglang.txt", "constraints/cuda-megatron.txt"),
    torch_build="torch.version.cuda",
)


@dataclass(frozen=True)
class Args(LauncherArgs):
    hardware: Literal["auto", "H100", "H200", "B200"] = arg(
        "auto", "GPU model; auto detects it on the node"
    )


LAUNCHER = recipe.launcher(
    __name__,
    args=Args,
    sglang=SGLANG,
    packages=PACKAGES,
    wandb_project="qwen3-4b-lora-cuda",
    recorded_hardware="H200",
    evidence=(
        "snapshots, argv contract; on 1x H200 the production job with Megatron-Bridge and with "
        "PyTorch + PEFT, interrupted and resumed, and the Qwen3-4B shape at 8,192-token "
        "responses (docs/backends.md, evidence table)"
    ),
)

if __name__ == "__main__":
    main(LAUNCHER)
