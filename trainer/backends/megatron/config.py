"""The Megatron trainer's config groups -> the settings of its Megatron parts, as plain dicts.

Each function returns the keyword arguments (or attributes) of one Megatron object, named as in
Megatron-core 0.16.1 / Megatron-Bridge 0.3.1: the model provider (``GPTModelProvider``, a
``TransformerConfig``), ``OptimizerConfig``, ``OptimizerParamScheduler``,
``DistributedDataParallelConfig`` and Bridge's ``LoRA``. Pure: `trainer.backends.megatron.trainer`
applies them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.backends.megatron.lora_names import LoraTargets
    from trainer.config import LoraConfig, MegatronConfig, OptimizerConfig


def train_dtype(dtype: str) -> str:
    """``bf16`` or ``fp32`` of ``--dtype`` (Megatron trains on GPUs, where ``auto`` means bf16)."""
    return "fp32" if dtype == "fp32" else "bf16"


def sequence_multiple(megatron: MegatronConfig) -> int:
    """Sequence lengths must be multiples of this: TP with sequence parallelism splits the
    sequence TP ways, context parallelism into ``2 * CP`` chunks."""
    tp = megatron.tensor_model_parallel_size if megatron.sequence_parallel else 1
    cp = megatron.context_parallel_size
    return math.lcm(tp, 2 * cp if cp > 1 else 1)


def provider_settings(megatron: MegatronConfig) -> dict[str, Any]:
    """Attributes set on the provider before ``finalize()`` (dtypes are set by the trainer)."""
    settings: dict[str, Any] = {
        "tensor_model_parallel_size": megatron.tensor_model_parallel_size,
        "pipeline_model_parallel_size": megatron.pipeline_model_parallel_size,
        "context_parallel_size": megatron.context_parallel_size,
        "expert_model_parallel_size": megatron.expert_model_parallel_size,
        "sequence_parallel": megatron.sequence_parallel,
        "recompute_granularity": megatron.recompute_granularity,
        "recompute_method": megatron.recompute_method,
        "recompute_num_layers": megatron.recompute_num_layers,
        "attention_dropout": megatron.attention_dropout,
        "hidden_dropout": megatron.hidden_dropout,
        # Micro-batches differ in length; pipeline stages exchange tensor shapes. Megatron-core
        # rejects that with its default (allgather) MoE dispatcher, even for dense models.
        "variable_seq_lengths": True,
        "moe_token_dispatcher_type": "alltoall",
        # Needs apex/TE fused kernels for no gain here: only the small adapters get gradients.
        "gradient_accumulation_fusion": False,
    }
    if megatron.attention_softmax_in_fp32:
        settings["attention_softmax_in_fp32"] = True
    return settings


def lora_settings(lora: LoraConfig, targets: LoraTargets) -> dict[str, Any]:
    """Bridge ``LoRA(...)`` kwargs; exclusions are resolved into the target list
    (`lora_names.resolve_targets`), because Bridge's own exclude mode would also wrap
    the output layer."""
    return {
        "target_modules": list(targets.megatron),
        "dim": lora.lora_rank,
        "alpha": lora.lora_alpha,
        "dropout": lora.lora_dropout,
    }


def ddp_settings(megatron: MegatronConfig) -> dict[str, Any]:
    return {
        "use_distributed_optimizer": True,
        "grad_reduce_in_fp32": megatron.accumulate_allreduce_grads_in_fp32,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
    }


def optimizer_settings(optimizer: OptimizerConfig, dtype: str) -> dict[str, Any]:
    """``OptimizerConfig`` kwargs (``params_dtype`` is added by the trainer). A clip of 0 turns
    clipping off, as in Megatron."""
    return {
        "optimizer": optimizer.optimizer,
        "lr": optimizer.lr,
        "min_lr": optimizer.min_lr,
        "weight_decay": optimizer.weight_decay,
        "adam_beta1": optimizer.adam_beta1,
        "adam_beta2": optimizer.adam_beta2,
        "adam_eps": optimizer.adam_eps,
        "clip_grad": optimizer.clip_grad,
        "bf16": train_dtype(dtype) == "bf16",
        "use_distributed_optimizer": True,
    }


def scheduler_settings(optimizer: OptimizerConfig, total_steps: int) -> dict[str, Any]:
    """``OptimizerParamScheduler`` kwargs: linear warmup from 0 over ``--lr-warmup-iters``, then
    ``--lr-decay-style`` to ``--min-lr`` at `total_steps`; constant weight decay."""
    warmup = optimizer.lr_warmup_iters
    decay_steps = max(total_steps, warmup + 1)
    return {
        "init_lr": 0.0 if warmup else optimizer.lr,
        "max_lr": optimizer.lr,
        "min_lr": optimizer.min_lr,
        "lr_warmup_steps": warmup,
        "lr_decay_steps": decay_steps,
        "lr_decay_style": optimizer.lr_decay_style,
        "start_wd": optimizer.weight_decay,
        "end_wd": optimizer.weight_decay,
        "wd_incr_steps": decay_steps,
        "wd_incr_style": "constant",
    }
