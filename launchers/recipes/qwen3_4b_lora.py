"""The Qwen3-4B GRPO LoRA recipe (Megatron-Bridge training, SGLang rollout), for every platform.

Everything but the platform is defined here, once: LoRA, rollout shape, engines, eval, optimizer,
GRPO, data and checkpoints. A launcher is one declaration, ``LAUNCHER = launcher(__name__,
...)``, of its platform choices: the hardware it supports and records, SGLang's attention and
LoRA backends (`SGLangBackends`), its wandb project, and its evidence. The platform
environment follows from the hardware (harness.platform), the cluster flags from the cluster
(harness.cluster_shape). tests/launchers/test_qwen3_4b_lora_twins.py holds the launchers to that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness import (
    CLUSTER_FLAGS,
    HubDownload,
    LaunchContext,
    Launcher,
    LauncherArgs,
    LaunchError,
    arg,
    execute_train,
    launcher_args,
    recipe_launcher,
    train_flags,
    wandb_flags,
)
from harness.cluster_shape import TrainArgv
from harness.launcher import SAFE_NAME

MODEL_ORG = "Qwen"
TRAIN_DATA_REPO = "zhuzilin/dapo-math-17k"
EVAL_DATA_REPO = "zhuzilin/aime-2024"

# The recipe's fixed blocks of train.py flags: the GRPO loss, and Megatron-Bridge training with
# SGLang rollout colocated on the cluster's GPUs.
GRPO = train_flags(
    advantage_estimator="grpo",
    kl_loss_coef=0.0,
    kl_loss_type="low_var_kl",
    entropy_coef=0.0,
    eps_clip=0.2,
    eps_clip_high=0.28,
    loss_agg="token-mean",
)
MISC = (
    *train_flags(
        train_backend="megatron",
        rollout_backend="sglang",
        attention_dropout=0.0,
        hidden_dropout=0.0,
        accumulate_allreduce_grads_in_fp32=True,
        attention_softmax_in_fp32=True,
    ),
    CLUSTER_FLAGS,
    *train_flags(colocate=True),
)


@dataclass(frozen=True)
class SGLangBackends:
    """SGLang kernels of one platform: ``--sglang-attention-backend``, ``--sglang-lora-backend``."""

    attention: str
    lora: str


@dataclass(frozen=True)
class Args(LauncherArgs):
    """The recipe's options; `launcher` narrows `hardware` and names the wandb project."""

    model_name: str = arg(
        "Qwen3-4B", f"model: downloads the Hub repo {MODEL_ORG}/<name> into <model-dir>/<name>"
    )
    save_interval: int = arg(50, "save a checkpoint every N rollouts")

    # LoRA: the Qwen3-4B Megatron LoRA recipe validated on CUDA.
    lora_rank: int = arg(64, "LoRA rank")
    lora_alpha: int = arg(32, "LoRA alpha")
    lora_dropout: float = arg(0.0, "LoRA dropout")
    target_modules: str = arg("all-linear", 'modules LoRA wraps: "all-linear" or a comma list')
    lora_base_cpu_backup: bool = arg(True, "keep the base weights' backup in CPU memory")

    # Rollout and optimizer shape: 8 prompts x 8 samples = one 64-sample update.
    num_rollout: int = arg(100, "rollouts (one optimizer update each)")
    rollout_batch_size: int = arg(8, "prompts per rollout")
    n_samples_per_prompt: int = arg(8, "samples per prompt (the GRPO group)")
    rollout_max_response_len: int = arg(8192, "response window in tokens")
    global_batch_size: int = arg(64, "samples per optimizer update")
    lr: float = arg(2e-5, "learning rate")

    # One 4B rollout engine per GPU, sharing it with training (colocated).
    rollout_num_gpus_per_engine: int = arg(1, "GPUs per SGLang engine")
    sglang_mem_fraction_static: float = arg(0.4, "SGLang's static share of GPU memory")

    enable_eval: bool = arg(True, "evaluate AIME-2024 (avg@16) every 20 rollouts")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not SAFE_NAME.fullmatch(self.model_name):
            raise LaunchError(f"--model-name must be a Hub model name ({self.model_name!r})")


def launcher(
    module: str,
    *,
    hardware: Sequence[str],
    recorded_hardware: str,
    sglang: SGLangBackends,
    wandb_project: str,
    evidence: str,
) -> Launcher:
    """The launcher that `module` (its ``__name__``) declares: this recipe on `hardware`,
    recorded as `recorded_hardware`, with SGLang's `sglang` kernels, logging to
    `wandb_project`; `evidence` is what has shown it works (the support matrix's cell)."""

    def train(ctx: LaunchContext, args: Args) -> None:
        """Run GRPO LoRA training on the model and data already on the node."""
        # Megatron overlaps communication with compute only on a single hardware queue.
        job_env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        execute_train(ctx, args, train_argv(ctx, args, sglang), job_env=job_env)

    return recipe_launcher(
        module,
        args=launcher_args(Args, module, hardware, wandb_project=wandb_project),
        prepare=prepare,
        train=train,
        recorded_hardware=recorded_hardware,
        evidence=evidence,
    )


def prepare(ctx: LaunchContext, args: Args) -> None:
    """Download Qwen3-4B, DAPO-Math-17k and, with eval on, AIME-2024."""
    ctx.emit(HubDownload(f"{MODEL_ORG}/{args.model_name}", f"{args.model_dir}/{args.model_name}"))
    ctx.emit(HubDownload(TRAIN_DATA_REPO, f"{args.data_dir}/dapo-math-17k", "dataset"))
    if args.enable_eval:
        ctx.emit(HubDownload(EVAL_DATA_REPO, f"{args.data_dir}/aime-2024", "dataset"))


def train_argv(ctx: LaunchContext, args: Args, backends: SGLangBackends) -> TrainArgv:
    """train.py's argv, block by block: checkpoint, LoRA, rollout, eval, optimizer, GRPO,
    wandb, SGLang, misc (with the cluster's flags)."""
    checkpoints = f"{args.output_dir}/{args.run_id}/checkpoints"

    checkpoint = train_flags(
        hf_checkpoint=f"{args.model_dir}/{args.model_name}",
        megatron_to_hf_mode="bridge",
        load=checkpoints,
        save=checkpoints,
        save_interval=args.save_interval,
        output_dir=f"{args.output_dir}/{args.run_id}",
    )
    lora = train_flags(
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.target_modules,
        lora_base_cpu_backup=args.lora_base_cpu_backup,
    )
    rollout = train_flags(
        prompt_data=f"{args.data_dir}/dapo-math-17k/dapo-math-17k.jsonl",
        input_key="prompt",
        label_key="label",
        apply_chat_template=True,
        rollout_shuffle=True,
        balance_data=True,
        rm_type="deepscaler",
        num_rollout=args.num_rollout,
        rollout_batch_size=args.rollout_batch_size,
        n_samples_per_prompt=args.n_samples_per_prompt,
        rollout_max_response_len=args.rollout_max_response_len,
        rollout_temperature=1.0,
        global_batch_size=args.global_batch_size,
    )
    evaluation = train_flags(
        eval_interval=20,
        eval_prompt_data=("aime24", f"{args.data_dir}/aime-2024/aime-2024.jsonl"),
        n_samples_per_eval_prompt=16,
        eval_max_response_len=16384,
        eval_top_p=1.0,
    )
    optimizer = train_flags(
        optimizer="adam",
        lr=args.lr,
        lr_decay_style="constant",
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.98,
    )
    sglang = train_flags(
        rollout_num_gpus_per_engine=args.rollout_num_gpus_per_engine,
        sglang_mem_fraction_static=args.sglang_mem_fraction_static,
        sglang_chunked_prefill_size=4096,
        sglang_lora_backend=backends.lora,
        sglang_attention_backend=backends.attention,
    )
    return [
        *checkpoint,
        *lora,
        *rollout,
        *(evaluation if args.enable_eval else []),
        *optimizer,
        *GRPO,
        *wandb_flags(ctx, args),
        *sglang,
        *MISC,
    ]
