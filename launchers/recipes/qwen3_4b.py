"""The Qwen3-4B GRPO LoRA recipe (Megatron-Bridge training, SGLang rollout), for every platform.

Everything but the platform is said here, once, as a training config: LoRA, rollout shape,
engines, eval, optimizer, GRPO, data and checkpoints (`config`), what `prepare` downloads, and
the job's environment (`train`), and what it needs of SGLang before Ray starts
(`SGLANG_NEEDS`). A platform's launcher file declares its hardware (`Args`) and
`launcher(__name__, ...)` with its SGLang kernels (`SGLangBackends`), where its packages come
from (`Packages`) and its wandb project; the platform environment follows from the hardware
(harness.platform), the placement from the cluster (harness.cluster_shape).
tests/launchers/test_qwen3_4b_lora_twins.py holds the launchers to that.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from harness import (
    HubDownload,
    LaunchContext,
    Launcher,
    LauncherArgs,
    execute_train,
    recipe_config,
    recipe_launcher,
    run_checkpoint,
)
from trainer.config import (
    AlgorithmConfig,
    BatchConfig,
    DataConfig,
    EvalConfig,
    LoraConfig,
    MegatronConfig,
    OptimizerConfig,
    PlacementConfig,
    PreflightConfig,
    RewardConfig,
    RolloutConfig,
    SGLangConfig,
    TrainConfig,
    WandbConfig,
)

MODEL_REPO = "Qwen/Qwen3-4B"
TRAIN_DATA_REPO = "zhuzilin/dapo-math-17k"
EVAL_DATA_REPO = "zhuzilin/aime-2024"


@dataclass(frozen=True)
class SGLangBackends:
    """SGLang kernels of one platform: ``--sglang-attention-backend``, ``--sglang-lora-backend``."""

    attention: str
    lora: str


@dataclass(frozen=True)
class Packages:
    """Where one platform's packages come from: its pinned sets (``--constraints``, relative to
    the checkout) and the torch build its GPUs need (a capability: ``torch.version.cuda`` or
    ``torch.version.hip``)."""

    constraints: tuple[str, ...]
    torch_build: str


# What the recipe needs of SGLang beyond its backend's own, checked before Ray starts: each
# adapter handed over from memory as one flattened bucket (SGLang 0.5.17), which the colocated
# step time of docs/performance.md was measured with. An image whose SGLang predates it is
# refused in one line instead of slowing down, or dying at its first weight update.
SGLANG_NEEDS = (
    "sglang.Engine.load_lora_adapter_from_tensors",
    "sglang.srt.weight_sync.tensor_bucket.FlattenedTensorMetadata",
)


# The recipe's blocks that no launch option changes (any of them: --set NAME=VALUE).
LORA = LoraConfig(lora_rank=64, lora_alpha=32, lora_base_cpu_backup=True)  # validated on CUDA
REWARD = RewardConfig(rm_type="deepscaler")
# 8 prompts x 8 samples = one 64-sample update per rollout, 8,192-token responses.
ROLLOUT = RolloutConfig(
    num_rollout=100, rollout_batch_size=8, n_samples_per_prompt=8, rollout_max_response_len=8192
)
BATCH = BatchConfig(global_batch_size=64, balance_data=True)
OPTIMIZER = OptimizerConfig(lr=2e-5, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.98)
ALGORITHM = AlgorithmConfig(
    advantage_estimator="grpo",
    kl_loss_coef=0.0,
    kl_loss_type="low_var_kl",
    entropy_coef=0.0,
    eps_clip_high=0.28,
    loss_agg="token-mean",
)
# Megatron-Bridge training and one 4B SGLang engine per GPU, colocated.
PLACEMENT = PlacementConfig(
    train_backend="megatron", rollout_backend="sglang", rollout_num_gpus_per_engine=1, colocate=True
)
MEGATRON = MegatronConfig(
    megatron_to_hf_mode="bridge",
    attention_dropout=0.0,
    hidden_dropout=0.0,
    accumulate_allreduce_grads_in_fp32=True,
    attention_softmax_in_fp32=True,
)


def config(
    args: LauncherArgs, *, sglang: SGLangBackends, packages: Packages, wandb_project: str
) -> TrainConfig:
    """The recipe on `args`' directories and run id, with SGLang's `sglang` kernels and the
    platform's `packages`."""
    data = args.data_dir
    return TrainConfig(
        checkpoint=run_checkpoint(args, MODEL_REPO.split("/")[1], save_interval=50),
        lora=LORA,
        data=DataConfig(
            prompt_data=f"{data}/dapo-math-17k/dapo-math-17k.jsonl",
            apply_chat_template=True,
            rollout_shuffle=True,
        ),
        reward=REWARD,
        rollout=ROLLOUT,
        batch=BATCH,
        # AIME-2024, avg@16, every 20 rollouts.
        eval=EvalConfig(
            eval_interval=20,
            eval_prompt_data=("aime24", f"{data}/aime-2024/aime-2024.jsonl"),
            n_samples_per_eval_prompt=16,
            eval_max_response_len=16384,
            eval_top_p=1.0,
        ),
        optimizer=OPTIMIZER,
        algorithm=ALGORITHM,
        wandb=WandbConfig(wandb_project=wandb_project),
        placement=PLACEMENT,
        megatron=MEGATRON,
        sglang=SGLangConfig(
            sglang_mem_fraction_static=0.4,
            sglang_chunked_prefill_size=4096,
            sglang_lora_backend=sglang.lora,
            sglang_attention_backend=sglang.attention,
        ),
        preflight=PreflightConfig(
            require_capability=(*SGLANG_NEEDS, packages.torch_build),
            constraints=packages.constraints,
        ),
    )


def launcher(
    module: str,
    *,
    args: type[LauncherArgs],
    sglang: SGLangBackends,
    packages: Packages,
    wandb_project: str,
    recorded_hardware: str,
    evidence: str,
) -> Launcher:
    """The launcher of this recipe that `module` (its ``__name__``) declares: its `args` (their
    ``--hardware`` the platform's), SGLang's `sglang` kernels there, its `packages`, its wandb
    project, what its snapshots represent and what has shown it works (the support matrix's
    cell)."""
    return recipe_launcher(
        module,
        args=args,
        config=functools.partial(
            config, sglang=sglang, packages=packages, wandb_project=wandb_project
        ),
        prepare=prepare,
        train=train,
        recorded_hardware=recorded_hardware,
        evidence=evidence,
    )


def prepare(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Download Qwen3-4B, DAPO-Math-17k and, with eval on, AIME-2024."""
    ctx.emit(HubDownload(MODEL_REPO, recipe_config(ctx, args).checkpoint.hf_checkpoint))
    ctx.emit(HubDownload(TRAIN_DATA_REPO, f"{args.data_dir}/dapo-math-17k", "dataset"))
    if recipe_config(ctx, args).eval.eval_prompt_data:
        ctx.emit(HubDownload(EVAL_DATA_REPO, f"{args.data_dir}/aime-2024", "dataset"))


def train(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Run GRPO LoRA training on the model and data already on the node."""
    # Megatron overlaps communication with compute only on a single hardware queue.
    execute_train(ctx, args, job_env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
