"""argv -> Megatron provider / optimizer / scheduler / DDP / LoRA settings."""

from __future__ import annotations

import sys

import pytest

from trainer.arguments import parse_args
from trainer.backends import registry
from trainer.backends.megatron import config as mc
from trainer.backends.megatron.lora_names import LoraNameError

BASE = [
    "--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl", "--train-backend", "megatron",
    "--rollout-backend", "sglang", "--actor-num-gpus-per-node", "8", "--rollout-batch-size", "8",
    "--n-samples-per-prompt", "8", "--lora-rank", "64", "--lora-alpha", "32",
]  # fmt: skip


def _args(*extra: str):
    return parse_args([*BASE, *extra])


def test_provider_settings_carry_parallelism_and_recompute() -> None:
    args = _args(
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--sequence-parallel", "--recompute-granularity", "full", "--recompute-method",
        "uniform", "--recompute-num-layers", "1", "--attention-softmax-in-fp32",
    )  # fmt: skip
    settings = mc.provider_settings(args.megatron)
    assert settings["tensor_model_parallel_size"] == 2
    assert settings["pipeline_model_parallel_size"] == 2
    assert settings["sequence_parallel"] is True
    assert (settings["recompute_granularity"], settings["recompute_method"]) == ("full", "uniform")
    assert settings["recompute_num_layers"] == 1
    assert settings["attention_softmax_in_fp32"] is True
    assert settings["variable_seq_lengths"] is True
    assert settings["moe_token_dispatcher_type"] == "alltoall"


def test_softmax_precision_is_left_to_the_model_unless_asked() -> None:
    assert "attention_softmax_in_fp32" not in mc.provider_settings(_args().megatron)


@pytest.mark.parametrize(
    ("extra", "multiple"),
    [
        ([], 1),
        (["--tensor-model-parallel-size", "4", "--sequence-parallel"], 4),
        (["--tensor-model-parallel-size", "4"], 1),
        (["--context-parallel-size", "2"], 4),
        (["--tensor-model-parallel-size", "2", "--sequence-parallel",
          "--context-parallel-size", "2"], 4),
        (["--tensor-model-parallel-size", "2", "--sequence-parallel",
          "--context-parallel-size", "4"], 8),
    ],
)  # fmt: skip
def test_sequence_multiple(extra: list[str], multiple: int) -> None:
    assert mc.sequence_multiple(_args(*extra).megatron) == multiple


def lora_settings(config) -> dict:
    return mc.lora_settings(config.lora, registry.adapter_targets(config))


def test_lora_settings_resolve_all_linear_and_exclusions() -> None:
    assert lora_settings(_args()) == {
        "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
        "dim": 64,
        "alpha": 32.0,
        "dropout": 0.0,
    }
    settings = lora_settings(_args("--exclude-modules", "gate_proj,up_proj"))
    assert settings["target_modules"] == ["linear_qkv", "linear_proj", "linear_fc2"]
    with pytest.raises(LoraNameError, match="cannot exclude up_proj alone"):
        lora_settings(_args("--exclude-modules", "up_proj"))


def test_optimizer_and_ddp_settings() -> None:
    args = _args(
        "--lr", "2e-5", "--min-lr", "1e-6", "--weight-decay", "0.1", "--adam-beta2", "0.98",
        "--clip-grad", "0", "--accumulate-allreduce-grads-in-fp32",
    )  # fmt: skip
    optim = mc.optimizer_settings(args.optimizer, args.placement.dtype)
    assert optim["lr"] == 2e-5 and optim["min_lr"] == 1e-6 and optim["clip_grad"] == 0.0
    assert optim["bf16"] is True and optim["use_distributed_optimizer"] is True
    assert mc.ddp_settings(args.megatron)["grad_reduce_in_fp32"] is True
    fp32 = _args("--dtype", "fp32")
    assert mc.optimizer_settings(fp32.optimizer, fp32.placement.dtype)["bf16"] is False


def test_scheduler_settings() -> None:
    sched = mc.scheduler_settings(
        _args("--lr-warmup-iters", "10", "--lr-decay-style", "cosine").optimizer, 100
    )
    assert sched["init_lr"] == 0.0 and sched["lr_warmup_steps"] == 10
    assert sched["lr_decay_steps"] == 100 and sched["lr_decay_style"] == "cosine"
    short = mc.scheduler_settings(_args("--lr-warmup-iters", "5").optimizer, 2)
    assert short["lr_decay_steps"] == 6  # Megatron needs warmup < decay steps
    assert mc.scheduler_settings(_args().optimizer, 3)["init_lr"] == 1e-5


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
