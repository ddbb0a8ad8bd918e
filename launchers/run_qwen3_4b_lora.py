"""Qwen3-4B GRPO LoRA on NVIDIA H100 / H200 / B200 (Megatron-Bridge training, SGLang rollout).

The CUDA twin of launchers/amd/run_qwen3_4b_lora.py: the same recipe
(launchers/recipes/qwen3_4b_lora.py), with SGLang backends chosen for NVIDIA GPUs. CUDA needs
no platform environment beyond Ray's defaults (harness.platform).

    python -m launchers.run_qwen3_4b_lora prepare
    python -m launchers.run_qwen3_4b_lora train --hardware H200
    python -m launchers.run_qwen3_4b_lora full-train --dry-run
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness import LaunchContext, Launcher, arg, multi_node_recordings
from harness.cli import main
from launchers.recipes import qwen3_4b_lora as recipe

# Attention: FlashInfer runs on Hopper (H100, H200) and Blackwell (B200); FA3 would be
# Hopper-only. LoRA: csgmv, SGLang's chunked-SGMV kernels, added as a faster LoRA backend than
# triton (sgl-project/sglang#10286). Both are values of SGLang's ServerArgs choices
# (ATTENTION_BACKEND_CHOICES, LORA_BACKEND_CHOICES in python/sglang/srt/server_args.py; see
# https://docs.sglang.io/advanced_features/lora.html).
SGLANG = recipe.SGLangBackends(attention="flashinfer", lora="csgmv")


@dataclass(frozen=True)
class Args(recipe.Args):
    hardware: Literal["auto", "H100", "H200", "B200"] = arg(
        "auto", "NVIDIA GPU model; auto detects it"
    )
    wandb_project: str = arg("qwen3-4b-lora-cuda", "wandb project")


def prepare(ctx: LaunchContext, args: Args) -> None:
    """Download Qwen3-4B, DAPO-Math-17k and, with eval on, AIME-2024."""
    recipe.prepare(ctx, args)


def train(ctx: LaunchContext, args: Args) -> None:
    """Run GRPO LoRA training on the model and data already on the node."""
    recipe.train(ctx, args, SGLANG)


def full_train(ctx: LaunchContext, args: Args) -> None:
    """Download the inputs, then train."""
    prepare(ctx, args)
    train(ctx, args)


def worker(ctx: LaunchContext, args: Args) -> None:
    """Join this node to the cluster of the head (--head-address) running `train --num-nodes`."""
    recipe.worker(ctx, args)


def sbatch(ctx: LaunchContext, args: Args) -> None:
    """Write the Slurm batch script of a --num-nodes run (submit it with sbatch)."""
    recipe.sbatch(ctx, args)


LAUNCHER = Launcher(
    args=Args,
    entrypoints=(prepare, train, full_train, worker, sbatch),
    recorded_hardware="H200",
    recordings=multi_node_recordings(),
)

if __name__ == "__main__":
    main(LAUNCHER)
