"""``--gradient-checkpointing-layers auto``: the fewest recomputed decoder layers whose trainer
fits the GPU by the estimate of `trainer.job.memory_estimate`, decided at the job's start with
``--colocate-memory``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trainer import tiny
from trainer.arguments import parse_args
from trainer.config import TrainConfig
from trainer.errors import UsageError
from trainer.job import colocate_memory, memory_estimate
from trainer.job.layer_activations import LayerWidths
from trainer.job.memory_estimate import GIB, DeviceMemory, ModelShape

# Qwen3-4B with the seed's LoRA, r64 on its 7 linear layers
QWEN3_4B = ModelShape(
    parameters=4_022_468_096,
    lora_parameters=64 * (6656 + 3584 + 3584 + 6656 + 3 * 12288) * 36,
    layer=LayerWidths(2560, 32, 8, 128, 9728, lora_rank=64, adapted_linears=7),
    num_layers=36,
    vocab_size=151_936,
    adapted_parameters=3_633_315_840,
)
H100 = DeviceMemory(free=79 * GIB, total=80 * GIB)  # 71 GiB usable
L40S = DeviceMemory(free=44 * GIB, total=45 * GIB)  # 39.5 GiB usable
# the seed's workload as the benchmark runs ours at 8,192-token responses
SEED_8K = (
    "--colocate", "--rollout-backend", "sglang", "--sglang-mem-fraction-static", "0.58",
    "--lora-serving", "merged", "--torch-compile-layers", "--lora-rank", "64",
    "--micro-batch-size", "1", "--rollout-max-prompt-len", "256",
    "--rollout-max-response-len", "8192", "--rollout-batch-size", "8",
    "--n-samples-per-prompt", "8", "--global-batch-size", "64",
    "--gradient-checkpointing", "--gradient-checkpointing-layers", "auto",
)  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=0)
    return root / "model"


def config_of(model: Path, *extra: str) -> TrainConfig:
    return parse_args(["--hf-checkpoint", str(model), "--prompt-data", "p.jsonl", *extra])


def trainer_fits(config: TrainConfig, layers: int, device: DeviceMemory) -> bool:
    """Whether the trainer with `layers` recomputed fits beside what the released engine keeps,
    reckoned here from the estimate's parts."""
    counted = replace(config, torch=replace(config.torch, gradient_checkpointing_layers=layers))
    trainer = colocate_memory.trainer_estimate(counted, QWEN3_4B).total
    usable = device.free - int(device.total * memory_estimate.MARGIN)
    return trainer + colocate_memory.released_engine(counted, QWEN3_4B) <= usable


@pytest.mark.parametrize(("device", "expected"), [(H100, 0), (L40S, 11)])
def test_the_fewest_recomputed_layers_whose_trainer_fits_are_chosen(model, device, expected):
    """At the seed's 8,192 tokens (one 8,448-token row a micro-batch, compiled merged layers),
    released: an H100 trains with no layer recomputed (47.9 GiB), a 45 GiB GPU recomputes 11 of
    36 (38.9 GiB)."""
    config = config_of(model, *SEED_8K, "--lora-base-cpu-backup")
    decided, plan = colocate_memory.choose(config, QWEN3_4B, device)
    layers = decided.torch.checkpointed_layers
    assert layers == expected
    assert trainer_fits(config, layers, device)
    assert layers == 0 or not trainer_fits(config, layers - 1, device)
    assert plan.trainer_fits and decided.placement.colocate_memory == "release"


def test_a_released_sglang_without_its_host_backup_keeps_its_weights_beside_the_trainer(model):
    """Without --lora-base-cpu-backup SGLang releases its KV cache and graphs only: its weights
    stay, and the trainer has that much less. Its merges read the trainer's base, which stays
    on the GPU too (`shared_base.lends_base`): no copy of its own."""
    backed_up = config_of(model, *SEED_8K, "--lora-base-cpu-backup")
    resident = config_of(model, *SEED_8K)
    assert colocate_memory.released_engine(backed_up, QWEN3_4B) == 0
    assert colocate_memory.released_engine(resident, QWEN3_4B) == QWEN3_4B.parameters * 2
    fewer = colocate_memory.choose(backed_up, QWEN3_4B, L40S)[0].torch.checkpointed_layers
    more = colocate_memory.choose(resident, QWEN3_4B, L40S)[0].torch.checkpointed_layers
    assert (fewer, more) == (11, 20)
    assert trainer_fits(resident, more, L40S) and not trainer_fits(resident, more - 1, L40S)


def test_kept_memory_is_tried_first_with_more_layers_recomputed(model):
    """With --colocate-memory auto too: both resident where some count of recomputed layers
    lets them fit (no swaps), else released with the fewest that fit then."""
    argv = [arg if arg != "8192" else "2048" for arg in SEED_8K]
    config = config_of(model, *argv, "--colocate-memory", "auto", "--lora-base-cpu-backup")
    kept, plan = colocate_memory.choose(config, QWEN3_4B, DeviceMemory(140 * GIB, 141 * GIB))
    assert kept.placement.colocate_memory == "keep" and plan.keep
    assert kept.torch.checkpointed_layers == 0
    squeezed, plan = colocate_memory.choose(config, QWEN3_4B, H100)
    layers = squeezed.torch.checkpointed_layers
    assert squeezed.placement.colocate_memory == "keep" and plan.keep and 0 < layers < 36
    fewer = colocate_memory.estimate(
        replace(squeezed, torch=replace(squeezed.torch, gradient_checkpointing_layers=layers - 1)),
        QWEN3_4B,
        device=H100,
    )
    assert not fewer.keep
    released, plan = colocate_memory.choose(config, QWEN3_4B, L40S)
    assert released.placement.colocate_memory == "release" and not plan.keep
    assert released.torch.checkpointed_layers == 0  # at 2,304 tokens the trainer fits alone


def test_a_trainer_that_fits_with_no_count_of_layers_is_one_line(model):
    config = config_of(model, *SEED_8K, "--lora-base-cpu-backup")
    small = DeviceMemory(free=20 * GIB, total=20 * GIB)
    with pytest.raises(UsageError) as caught:
        colocate_memory.choose(config, QWEN3_4B, small)
    message = str(caught.value)
    assert message.startswith(
        "--gradient-checkpointing-layers auto: with every layer recomputed the trainer needs "
    )
    assert message.endswith("more than the 18.00 GiB usable on the GPU; lower --micro-batch-size")
    assert "\n" not in message
    resident = config_of(model, *SEED_8K)
    with pytest.raises(UsageError, match=r"GiB beside the 7\.49 GiB the released engine keeps"):
        colocate_memory.choose(resident, QWEN3_4B, small)
    kept = config_of(model, *SEED_8K, "--colocate-memory", "keep")
    with pytest.raises(UsageError, match=r"trainer and engine need \d+\.\d\d GiB both resident"):
        colocate_memory.choose(kept, QWEN3_4B, small)


def test_the_decision_is_printed_and_the_config_holds_a_count(model, capsys):
    config = config_of(model, *SEED_8K, "--lora-base-cpu-backup")
    with pytest.raises(ValueError, match="undecided"):
        _ = config.torch.checkpointed_layers
    decided = colocate_memory.resolve(config, QWEN3_4B, device="cuda", device_memory=lambda: L40S)
    assert decided.torch.gradient_checkpointing_layers == 11
    assert capsys.readouterr().out.startswith(
        "train.py: --gradient-checkpointing-layers auto: 11 of 36 decoder layers recomputed, the "
        "fewest whose trainer ("
    )
    apart = config_of(model, *[a for a in SEED_8K if a != "--colocate"])
    colocate_memory.resolve(apart, QWEN3_4B, device="cuda", device_memory=lambda: L40S)
    assert "fits alone on its GPU in 39.50 GiB usable" in capsys.readouterr().out


def test_on_the_cpu_every_layer_is_recomputed_without_measuring(model, capsys):
    config = config_of(model, "--gradient-checkpointing", "--gradient-checkpointing-layers", "auto")

    def never_measured() -> DeviceMemory:
        raise AssertionError("nothing to measure on the CPU")

    decided = colocate_memory.resolve(config, None, device="cpu", device_memory=never_measured)
    assert decided.torch.checkpointed_layers == -1
    assert capsys.readouterr().out == (
        "train.py: --gradient-checkpointing-layers auto: every layer (on the CPU nothing is "
        "weighed)\n"
    )


def test_the_model_is_sized_for_the_torch_backend_alone(model):
    """Megatron reads its own --recompute-* flags: the torch backend's auto is not weighed."""
    layers_auto = ("--gradient-checkpointing", "--gradient-checkpointing-layers", "auto")
    shape = colocate_memory.model_shape_for(config_of(model, *layers_auto))
    assert shape is not None and shape.num_layers == 2
    megatron = config_of(model, *layers_auto, "--train-backend", "megatron")
    assert not colocate_memory.undecided(megatron)
    assert colocate_memory.model_shape_for(megatron) is None
