"""The PEFT trainer's policy under ``--lora-serving merged``
(`trainer.backends.torch.merged_policy`): the merged weights the engines serve, with LoRA's
gradients."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.lora.layer import Linear
from transformers import AutoModelForCausalLM

from tests.support.tiny_training import (
    CountedOps,
    away_from_base,
    mean_logprob_loss,
    micro_batches,
)
from trainer import tiny
from trainer.backends.base import TrainBatch
from trainer.backends.lora_merge import LoraMerger, MergeError, merged_weight
from trainer.backends.torch.merged_policy import MergedLinearFunction
from trainer.backends.torch.trainer import PeftPolicyTrainer
from trainer.config import LoraConfig, OptimizerConfig

IDS = torch.tensor([[1, 4, 7, 8, 2, 1, 6, 9, 3, 5]])
# bf16 kernels differ per device: the bf16 tests run on an NVIDIA GPU too (pytest -m cuda_gpu)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda_gpu)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=3)
    return str(root / "model")


def new_trainer(model_dir: str, *, merged: bool, **options) -> PeftPolicyTrainer:
    return PeftPolicyTrainer(
        model_dir,
        LoraConfig(lora_rank=4, lora_alpha=8.0),
        OptimizerConfig(lr=1e-2),
        total_steps=10,
        merged=merged,
        **options,
    )


def make_trainer(model_dir: str, *, merged: bool, **options) -> PeftPolicyTrainer:
    return away_from_base(new_trainer(model_dir, merged=merged, **options))


def logits_and_grads(trainer: PeftPolicyTrainer) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    trainer.model.train()
    trainer.model.zero_grad(set_to_none=True)
    logits = trainer.model(input_ids=IDS).logits
    logits.float().log_softmax(-1)[0, :-1].gather(-1, IDS[0, 1:, None]).sum().backward()
    grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


def test_in_float32_the_merged_policy_and_its_gradients_are_the_adapters(model_dir):
    adapter_logits, adapter_grads = logits_and_grads(make_trainer(model_dir, merged=False))
    merged_logits, merged_grads = logits_and_grads(make_trainer(model_dir, merged=True))
    torch.testing.assert_close(merged_logits, adapter_logits, atol=1e-5, rtol=1e-5)
    assert merged_grads.keys() == adapter_grads.keys() and len(merged_grads) > 0
    for name, grad in merged_grads.items():
        torch.testing.assert_close(grad, adapter_grads[name], atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_in_bf16_a_layer_computes_the_merged_weight_with_lora_s_gradients(device):
    """The forward is the served weight's, bit for bit; the gradients are the definitions' (in
    float64, to bf16's precision), with the rounding passed straight through."""
    generator = torch.Generator().manual_seed(1)

    def random(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device, dtype)

    x = random(2, 5, 12).requires_grad_()
    base = random(6, 12)
    bias = random(6).requires_grad_()
    a = random(3, 12, dtype=torch.float32).requires_grad_()
    b = random(6, 3, dtype=torch.float32).requires_grad_()
    grad = random(2, 5, 6)
    y = MergedLinearFunction.apply(x, base, bias, a, b, 0.5, torch.bfloat16, None)
    y.backward(grad)

    weight = merged_weight(base, a.detach().bfloat16(), b.detach().bfloat16(), 0.5)
    assert torch.equal(y, torch.nn.functional.linear(x.detach(), weight, bias.detach()))
    rows, dy = x.detach().double().reshape(10, 12), grad.double().reshape(10, 6)
    dw = dy.t() @ rows
    expected = {
        "x": (dy @ weight.double()).reshape(2, 5, 12),
        "bias": dy.sum(0),
        "a": 0.5 * b.detach().bfloat16().double().t() @ dw,
        "b": 0.5 * dw @ a.detach().bfloat16().double().t(),
    }
    for name, tensor in {"x": x, "bias": bias, "a": a, "b": b}.items():
        assert tensor.grad.dtype == tensor.dtype, name
        torch.testing.assert_close(tensor.grad.double(), expected[name], atol=0.1, rtol=2e-2)


def test_merging_in_every_pass_keeps_no_merged_weight_for_backward(model_dir):
    """Outside `weights_kept` (``--no-keep-merged-weights``) each layer merges again in
    backward: the forward keeps its input, not a merged copy of every adapted weight until
    backward (0.88 GB at Qwen3-0.6B's shape, 7.3 GB at 4B's)."""
    trainer = make_trainer(model_dir, merged=True)
    served = list(trainer.merged.served().values())
    saved: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        trainer.model(input_ids=IDS).logits.sum().backward()
    matrices = [t for t in saved if t.dim() == 2] + [t.mT for t in saved if t.dim() == 2]
    assert len(matrices) > len(served)
    for weight in served:
        assert not any(t.shape == weight.shape and torch.equal(t, weight) for t in matrices)


def test_gradient_checkpointing_recomputes_the_merged_weights(model_dir):
    _, plain = logits_and_grads(make_trainer(model_dir, merged=True))
    _, recomputed = logits_and_grads(
        make_trainer(model_dir, merged=True, gradient_checkpointing=True)
    )
    for name, grad in recomputed.items():
        torch.testing.assert_close(grad, plain[name], atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_in_bf16_the_trainer_computes_with_exactly_the_weights_the_engine_merges(model_dir, device):
    trainer = make_trainer(model_dir, merged=True, dtype="bf16", device=device)
    adapter = trainer.export_adapter()
    merger = LoraMerger.from_checkpoint(model_dir, device=device, dtype=torch.bfloat16)
    merged = merger.merge(adapter)
    computed = trainer.merged.served()
    linear = [n for n, m in trainer.model.get_base_model().named_modules() if isinstance(m, Linear)]
    assert computed.keys() == set(merged) == {f"{name}.weight" for name in linear}
    for name, weight in merged.items():
        assert computed[name].dtype == torch.bfloat16
        assert torch.equal(computed[name], weight), name


@pytest.mark.parametrize("device", DEVICES)
def test_the_base_the_trainer_lends_is_its_own_and_the_engine_merges_the_same_from_it(
    model_dir, device
):
    """`shared_base`: an engine merging from the trainer's base tensors merges exactly what it
    merges from the checkpoint, reads no base of its own, and leaves the lent base as it was."""
    trainer = make_trainer(model_dir, merged=True, dtype="bf16", device=device)
    lent = trainer.merged_base()
    own = {p.data_ptr() for p in trainer.model.parameters()}
    assert lent and all(weight.data_ptr() in own for weight in lent.values())
    before = {name: weight.clone() for name, weight in lent.items()}
    adapter = trainer.export_adapter()

    def no_reading(names: list[str]) -> dict[str, torch.Tensor]:
        raise AssertionError(f"the merger read {names[:1]} with the trainer's base lent")

    borrower = LoraMerger(no_reading, device, torch.bfloat16)
    borrower.borrow(lent)
    merged = borrower.merge(adapter)
    reference = LoraMerger.from_checkpoint(model_dir, device=device, dtype=torch.bfloat16)
    expected = reference.merge(adapter)
    assert set(merged) == set(expected) == set(lent)
    for name in expected:
        assert torch.equal(merged[name], expected[name]), name
        assert torch.equal(lent[name], before[name]), name
        assert torch.equal(lent[name], reference.base[name]), name


def test_only_the_merged_policy_s_trainer_lends_a_base(model_dir):
    with pytest.raises(ValueError, match="only the merged policy's trainer"):
        new_trainer(model_dir, merged=False).merged_base()


def test_the_reference_policy_is_the_base_model(model_dir):
    trainer = make_trainer(model_dir, merged=True)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    trainer.model.eval()
    with torch.no_grad():
        expected = base(input_ids=IDS).logits
        with trainer.merged.base_only():
            without = trainer.model(input_ids=IDS).logits
        served = trainer.model(input_ids=IDS).logits
    torch.testing.assert_close(without, expected, atol=1e-5, rtol=1e-5)
    assert (served - expected).abs().max() > 1e-3  # merged again after the block


def test_the_exported_adapter_keeps_peft_s_names_and_values(model_dir):
    plain = make_trainer(model_dir, merged=False).export_adapter().tensors
    merged = make_trainer(model_dir, merged=True).export_adapter().tensors
    assert list(merged) == list(plain)
    for name, tensor in merged.items():
        assert torch.equal(tensor, plain[name]), name


def test_only_linear_layers_merge(model_dir):
    with pytest.raises(MergeError, match=r"merges linear layers; .*embed_tokens is a Embedding"):
        PeftPolicyTrainer(
            model_dir,
            LoraConfig(lora_rank=4, lora_alpha=8.0, target_modules="embed_tokens,q_proj"),
            OptimizerConfig(lr=1e-2),
            total_steps=1,
            merged=True,
        )


def test_a_saved_merged_trainer_loads_into_the_same_merged_policy(model_dir, tmp_path):
    saved = make_trainer(model_dir, merged=True)
    saved.save(tmp_path / "iter")
    loaded = new_trainer(model_dir, merged=True)
    loaded.load(tmp_path / "iter")
    with torch.no_grad():
        expected = saved.model(input_ids=IDS).logits
        torch.testing.assert_close(loaded.model(input_ids=IDS).logits, expected)
        with loaded.merged.base_only():
            assert (loaded.model(input_ids=IDS).logits - expected).abs().max() > 1e-3


def is_merge(func, args) -> bool:
    """A merge: the only ``addmm`` of the tiny model (its linear layers have no bias)."""
    return func is torch.ops.aten.addmm.default


def trained(trainer: PeftPolicyTrainer, batches: list[TrainBatch]) -> tuple[int, dict]:
    """Merges of one optimizer step over `batches`, and the adapter after it."""
    with CountedOps(is_merge) as counter:
        trainer.train_step(batches, mean_logprob_loss)
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return counter.count, params


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "recomputed"])
@pytest.mark.parametrize("device", DEVICES)
def test_kept_merged_weights_train_the_adapter_bit_for_bit_as_merging_in_every_pass(
    model_dir, device, checkpointing
):
    """One merge per layer per optimizer step instead of one per pass (forward, recompute,
    backward) of every micro-batch; in bf16, the same adapter after the step bit for bit.
    Without checkpointing, the first layer's q, k and v projections do not merge in backward:
    their input, the frozen embeddings' output, needs no gradient (checkpointing makes it
    require one)."""
    options = {"dtype": "bf16", "device": device, "gradient_checkpointing": checkpointing}
    batches = micro_batches([10, 10, 10], prompt=5)
    kept = make_trainer(model_dir, merged=True, **options)
    per_pass = make_trainer(model_dir, merged=True, keep_merged_weights=False, **options)
    layers = len(kept.merged.layers)
    kept_merges, kept_params = trained(kept, batches)
    per_pass_merges, per_pass_params = trained(per_pass, batches)
    assert kept_merges == layers
    passes, skipped = (3, 0) if checkpointing else (2, 3)
    assert per_pass_merges == len(batches) * (passes * layers - skipped)
    assert kept_params.keys() == per_pass_params.keys()
    for name, param in kept_params.items():
        assert torch.equal(param, per_pass_params[name]), name
    assert all(layer.kept is None for layer in kept.merged.layers.values())


def test_inside_weights_kept_the_merged_weights_are_what_backward_keeps(model_dir):
    trainer = make_trainer(model_dir, merged=True)
    saved: list[torch.Tensor] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with trainer.merged.weights_kept():
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            trainer.model(input_ids=IDS).logits.sum().backward()
        kept = [layer.kept.weight for layer in trainer.merged.layers.values()]
    for weight in kept:
        assert any(t is weight for t in saved)
