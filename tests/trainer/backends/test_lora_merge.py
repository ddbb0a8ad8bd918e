"""LoRA adapters merged into the base's linear weights (`--lora-serving merged`)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from trainer import tiny
from trainer.backends.base import LoraAdapter
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.lora_merge import (
    LoraMerger,
    MergeError,
    adapted_weights,
    lora_layers,
    lora_scaling,
    merged_weight,
    read_weights,
)
from trainer.backends.torch.rollout import HFRolloutEngine
from trainer.backends.torch.trainer import PeftPolicyTrainer
from trainer.config import LoraConfig, OptimizerConfig

SEQUENCE = [1, 4, 7, 8, 2, 1, 6, 9, 3, 5]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=5)
    return str(root / "model")


@pytest.fixture(scope="module")
def trained(model_dir) -> PeftPolicyTrainer:
    """A trainer whose adapter moved away from the base (B is 0 at the start)."""
    trainer = PeftPolicyTrainer(
        model_dir,
        LoraConfig(lora_rank=4, lora_alpha=8.0),
        OptimizerConfig(lr=1e-2),
        total_steps=10,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return trainer


def test_merged_weights_are_what_peft_merges(model_dir, trained):
    adapter = trained.export_adapter()
    merged = LoraMerger.from_checkpoint(model_dir, device="cpu", dtype=torch.float32).merge(adapter)
    assert isinstance(merged, FlatTensors)
    reference = copy.deepcopy(trained.model).merge_and_unload().state_dict()
    assert len(merged) == len(lora_layers(adapter.tensors)) > 0
    for name, weight in merged.items():
        assert torch.allclose(weight, reference[name], atol=1e-6), name
    base = read_weights(Path(model_dir), list(merged), torch.float32)
    assert not any(torch.equal(merged[n], base[n]) for n in merged)  # B is not 0: all moved


def test_an_engine_serving_merged_weights_scores_as_one_serving_the_adapter(model_dir, trained):
    adapter = trained.export_adapter()
    served, merged, base = (HFRolloutEngine(model_dir, merged=m) for m in (False, True, True))
    served.load_adapter(adapter)
    merged.load_adapter(adapter)
    (through_adapter,), (through_merge,), (without,) = (
        e.score(SEQUENCE) for e in (served, merged, base)
    )
    assert max(abs(a - b) for a, b in zip(through_adapter, through_merge, strict=True)) < 1e-5
    assert max(abs(a - b) for a, b in zip(through_adapter, without, strict=True)) > 1e-3
    assert merged.adapter_version == adapter.version


def test_each_merge_starts_from_the_base_not_from_the_previous_merge(model_dir, trained):
    adapter = trained.export_adapter()
    merger = LoraMerger.from_checkpoint(model_dir, device="cpu", dtype=torch.float32)
    first = {k: v.clone() for k, v in merger.merge(adapter).items()}
    again = merger.merge(adapter)
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_released_base_weights_come_back_from_their_host_copy(model_dir, trained):
    """A colocated engine gives their device memory to the trainer while it trains; the host
    copy is made once, so later releases copy nothing back to the host."""
    adapter = trained.export_adapter()
    merger = LoraMerger.from_checkpoint(model_dir, device="cpu", dtype=torch.float32)
    first = {k: v.clone() for k, v in merger.merge(adapter).items()}
    kept = dict(merger.base)
    merger.release()
    assert merger.base == {}
    merger.restore()
    assert merger.base.keys() == kept.keys()
    assert all(torch.equal(merger.base[k], kept[k]) for k in kept)
    host = {k: v.data_ptr() for k, v in merger.host.items()}
    merger.release()
    assert {k: v.data_ptr() for k, v in merger.host.items()} == host  # not copied again
    merger.restore()
    again = merger.merge(adapter)
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_base_on_the_device_only_to_merge_is_read_from_the_checkpoint_once(model_dir, trained):
    """SGLang's engine where its weights leave the GPU: restore, merge, release, each update.
    The first restore finds no host copy and the merge reads the checkpoint; the later ones
    merge from the host copy."""
    adapter = trained.export_adapter()
    reads: list[list[str]] = []

    def load_base(names: list[str]) -> dict[str, torch.Tensor]:
        reads.append(names)
        return read_weights(Path(model_dir), names, torch.float32)

    merger = LoraMerger(load_base, "cpu", torch.float32)
    merged = []
    for _ in range(3):
        merger.restore()
        merged.append({k: v.clone() for k, v in merger.merge(adapter).items()})
        merger.release()
        assert merger.base == {}
    assert len(reads) == 1
    assert all(torch.equal(merged[0][k], later[k]) for later in merged[1:] for k in later)


def test_a_base_kept_on_the_host_from_the_start_is_all_that_any_update_reads(model_dir, trained):
    """SGLang's engine whose weights leave the GPU reads its merge base as it starts: the
    checkpoint's adapted weights (those PEFT adapts, found from the headers and the targets)
    into their host copies. Every update, the first too, restores, merges and releases, reads
    nothing more and copies nothing back to the host, and merges what the merge on demand does."""
    adapter = trained.export_adapter()
    layers = {layer.weight for layer in lora_layers(adapter.tensors)}
    targets = {name.split(".")[-2] for name in layers}
    names = adapted_weights(model_dir, targets)
    assert sorted(names) == sorted(layers)
    reads: list[list[str]] = []

    def load_base(names: list[str]) -> dict[str, torch.Tensor]:
        reads.append(names)
        return read_weights(Path(model_dir), names, torch.float32)

    merger = LoraMerger(load_base, "cpu", torch.float32)
    merger.keep_on_host(names)
    host = {k: v.data_ptr() for k, v in merger.host.items()}
    assert merger.base == {} and host.keys() == layers
    on_demand = LoraMerger.from_checkpoint(model_dir, device="cpu", dtype=torch.float32)
    expected = on_demand.merge(adapter)
    for _ in range(2):
        merger.restore()
        merged = merger.merge(adapter)
        assert all(torch.equal(merged[k], expected[k]) for k in expected)
        merger.release()
    assert len(reads) == 1
    assert {k: v.data_ptr() for k, v in merger.host.items()} == host


def test_an_engine_merging_into_the_trainer_s_base_scores_as_one_with_its_own(model_dir, trained):
    adapter = trained.export_adapter()
    own, borrowing = (HFRolloutEngine(model_dir, merged=True) for _ in range(2))
    lent = {
        n.removeprefix("base_model.model.").replace(".base_layer", ""): p.detach()
        for n, p in trained.model.named_parameters()
        if n.endswith("base_layer.weight")
    }
    borrowing.borrow_base(lent)
    own.load_adapter(adapter)
    borrowing.load_adapter(adapter)
    assert own.score(SEQUENCE) == borrowing.score(SEQUENCE)
    # it merged into the lent tensors themselves and read no base of its own
    assert borrowing.merger.base.keys() == lent.keys()
    assert all(borrowing.merger.base[name] is weight for name, weight in lent.items())
    with pytest.raises(ValueError, match="borrows no base"):
        HFRolloutEngine(model_dir).borrow_base({})


@pytest.mark.parametrize(
    ("weight", "message"),
    [
        (torch.zeros(2, 2, dtype=torch.bfloat16), r"is torch.bfloat16 on cpu; the merge needs "
         r"torch.float32 on cpu"),
        (torch.zeros(2, 2, device="meta"), "on meta; the merge needs"),
    ],
)  # fmt: skip
def test_a_lent_base_in_another_dtype_or_on_another_device_is_refused(weight, message):
    merger = LoraMerger(lambda names: {}, "cpu", torch.float32)
    with pytest.raises(MergeError, match=message):
        merger.borrow({"model.layers.0.mlp.up_proj.weight": weight})
    assert merger.base == {}


def test_merging_rounds_once_from_float32():
    base = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)
    a = torch.tensor([[0.001, 0.002]], dtype=torch.bfloat16)
    b = torch.tensor([[1.0]], dtype=torch.bfloat16)
    merged = merged_weight(base, a, b, scaling=3.0)
    assert merged.dtype == torch.bfloat16
    expected = (base.float() + 3.0 * b.float() @ a.float()).to(torch.bfloat16)
    assert torch.equal(merged, expected)


class PrecisionAtAddmm(TorchFunctionMode):
    """Records the float32 matmul precision in effect at each ``torch.addmm``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.addmm:
            self.seen.append(torch.get_float32_matmul_precision())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("outside", ["high", "medium", "highest"])
def test_the_merge_is_full_float32_whatever_the_process_allows(outside):
    """TF32 (``"high"``, what SGLang's ``--enable-tf32-matmul`` sets) or bf16 passes
    (``"medium"``) in one process and not the other would merge different weights."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(outside)
    try:
        with PrecisionAtAddmm() as mode:
            merged_weight(torch.ones(2, 3), torch.ones(1, 3), torch.ones(2, 1), scaling=2.0)
        assert mode.seen == ["highest"]
        assert torch.get_float32_matmul_precision() == outside
    finally:
        torch.set_float32_matmul_precision(previous)


@pytest.mark.parametrize(
    ("config", "scaling"),
    [
        ({"r": 16, "lora_alpha": 32}, 2.0),
        ({"r": 16, "lora_alpha": 32, "use_rslora": True}, 32 / math.sqrt(16)),
    ],
)
def test_scaling_is_peft_s(config, scaling):
    assert lora_scaling(config) == pytest.approx(scaling)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"r": 4, "lora_alpha": 8, "use_dora": True}, "DoRA"),
        ({"r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ],
)
def test_adapters_it_cannot_merge_are_refused(config, message):
    with pytest.raises(MergeError, match=message):
        lora_scaling(config)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"], "only one of A and B"),
        (["base_model.model.model.layers.0.mlp.up_proj.lora_magnitude_vector"], "not a PEFT"),
        (["model.layers.0.mlp.up_proj.lora_A.weight"], "not a PEFT"),
    ],
)
def test_unexpected_adapter_names_are_refused(names, message):
    with pytest.raises(MergeError, match=message):
        lora_layers(names)


def test_a_layer_the_checkpoint_lacks_is_named(model_dir):
    name = "base_model.model.model.layers.99.mlp.up_proj.lora_{}.weight"
    adapter = LoraAdapter(
        tensors={name.format("A"): torch.zeros(2, 4), name.format("B"): torch.zeros(4, 2)},
        config={"r": 2, "lora_alpha": 2},
    )
    merger = LoraMerger.from_checkpoint(model_dir, device="cpu", dtype=torch.float32)
    with pytest.raises(MergeError, match=r"no weight model\.layers\.99\.mlp\.up_proj\.weight"):
        merger.merge(adapter)


def test_allocated_flat_tensors_are_aligned_views_to_fill():
    flat = FlatTensors.allocate(
        [("a", torch.bfloat16, (3,)), ("b", torch.float32, (2, 2))], device="cpu"
    )
    flat["b"].copy_(torch.ones(2, 2))
    assert flat.entries[1].start % 16 == 0
    assert torch.equal(flat["b"], torch.ones(2, 2))
    assert flat["a"].shape == (3,) and flat["a"].dtype == torch.bfloat16
