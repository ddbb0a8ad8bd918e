"""Qwen3-4B GRPO LoRA on AMD Instinct MI350X / MI355X (Megatron-Bridge training, SGLang rollout).

The shared Qwen3-4B LoRA recipe (launchers/recipes/qwen3_4b_lora.py) with SGLang's attention and
LoRA backends pinned to Triton: the CUDA-only backends do not exist on ROCm. The ROCm
environment (Ray keeps its hands off device visibility, HIP_VISIBLE_DEVICES is mirrored into
CUDA_VISIBLE_DEVICES, no NVLink SHARP) comes from harness.platform.

    python -m launchers.amd.run_qwen3_4b_lora prepare
    python -m launchers.amd.run_qwen3_4b_lora train --hardware MI355X
    python -m launchers.amd.run_qwen3_4b_lora full-train --dry-run
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from harness import LaunchContext, Launcher, arg, multi_node_recordings
from harness.cli import main
from launchers.recipes import qwen3_4b_lora as recipe

# ROCm has none of SGLang's CUDA-only backends: Triton for attention and for LoRA.
SGLANG = recipe.SGLangBackends(attention="triton", lora="triton")


@dataclass(frozen=True)
class Args(recipe.Args):
    hardware: Literal["auto", "MI350X", "MI355X"] = arg("auto", "AMD GPU model; auto detects it")
    wandb_project: str = arg("qwen3-4b-lora-amd", "wandb project")


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
    recorded_hardware="MI355X",
    recordings=multi_node_recordings(),
)

if __name__ == "__main__":
    main(LAUNCHER)
