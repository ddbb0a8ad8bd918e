"""``train.py``'s argv -> the settings of the Megatron trainer's parts, as plain dicts.

Each function returns the keyword arguments (or attributes) of one Megatron object, named as in
Megatron-core 0.16.1 / Megatron-Bridge 0.3.1: the model provider (``GPTModelProvider``, a
``TransformerConfig``), ``OptimizerConfig``, ``OptimizerParamScheduler``,
``DistributedDataParallelConfig`` and Bridge's ``LoRA``. Pure: `megatron_trainer` applies them.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from trainer.backends.megatron_lora_names import resolve_targets


def train_dtype(args: argparse.Namespace) -> str:
    """``bf16`` or ``fp32`` (Megatron trains on GPUs, where ``auto`` means bf16)."""
    return "fp32" if args.dtype == "fp32" else "bf16"


def sequence_multiple(args: argparse.Namespace) -> int:
    """Sequence lengths must be multiples of this: TP with sequence parallelism splits the
    sequence TP ways, context parallelism into ``2 * CP`` chunks."""
    tp = args.tensor_model_parallel_size if args.sequence_parallel else 1
    cp = 2 * args.context_parallel_size if args.context_parallel_size > 1 else 1
    return math.lcm(tp, cp)


def provider_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Attributes set on the provider before ``finalize()`` (dtypes are set by the trainer)."""
    settings: dict[str, Any] = {
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "context_parallel_size": args.context_parallel_size,
        "expert_model_parallel_size": args.expert_model_parallel_size,
        "sequence_parallel": args.sequence_parallel,
        "recompute_granularity": args.recompute_granularity,
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "attention_dropout": args.attention_dropout,
        "hidden_dropout": args.hidden_dropout,
        # Micro-batches differ in length; pipeline stages exchange tensor shapes. Megatron-core
        # rejects that with its default (allgather) MoE dispatcher, even for dense models.
        "variable_seq_lengths": True,
        "moe_token_dispatcher_type": "alltoall",
        # Needs apex/TE fused kernels for no gain here: only the small adapters get gradients.
        "gradient_accumulation_fusion": False,
    }
    if args.attention_softmax_in_fp32:
        settings["attention_softmax_in_fp32"] = True
    return settings


def lora_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Bridge ``LoRA(...)`` kwargs; exclusions are resolved into the target list, because
    Bridge's own exclude mode would also wrap the output layer."""
    targets = resolve_targets(args.target_modules, args.exclude_modules)
    return {
        "target_modules": list(targets.megatron),
        "dim": args.lora_rank,
        "alpha": args.lora_alpha,
        "dropout": args.lora_dropout,
    }


def ddp_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "use_distributed_optimizer": True,
        "grad_reduce_in_fp32": args.accumulate_allreduce_grads_in_fp32,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
    }


def optimizer_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``OptimizerConfig`` kwargs (``params_dtype`` is added by the trainer). A clip of 0 turns
    clipping off, as in Megatron."""
    return {
        "optimizer": args.optimizer,
        "lr": args.lr,
        "min_lr": args.min_lr,
        "weight_decay": args.weight_decay,
        "adam_beta1": args.adam_beta1,
        "adam_beta2": args.adam_beta2,
        "adam_eps": args.adam_eps,
        "clip_grad": args.clip_grad,
        "bf16": train_dtype(args) == "bf16",
        "use_distributed_optimizer": True,
    }


def scheduler_settings(args: argparse.Namespace, total_steps: int) -> dict[str, Any]:
    """``OptimizerParamScheduler`` kwargs: linear warmup from 0 over ``--lr-warmup-iters``, then
    ``--lr-decay-style`` to ``--min-lr`` at `total_steps`; constant weight decay."""
    decay_steps = max(total_steps, args.lr_warmup_iters + 1)
    return {
        "init_lr": 0.0 if args.lr_warmup_iters else args.lr,
        "max_lr": args.lr,
        "min_lr": args.min_lr,
        "lr_warmup_steps": args.lr_warmup_iters,
        "lr_decay_steps": decay_steps,
        "lr_decay_style": args.lr_decay_style,
        "start_wd": args.weight_decay,
        "end_wd": args.weight_decay,
        "wd_incr_steps": decay_steps,
        "wd_incr_style": "constant",
    }
