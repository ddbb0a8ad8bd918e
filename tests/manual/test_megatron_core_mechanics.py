"""The Megatron trainer's mechanics on one GPU, with Megatron-core alone (no Bridge, no TE).

`MegatronPolicyTrainer` drives a hand-built Megatron-core GPT (local layer spec) wrapped in
Megatron's DDP with the distributed optimizer, and LoRA adapters shaped and named like
Megatron-Bridge's (``<linear>.adapter.linear_in/linear_out``, scale alpha/rank). Checked against
plain PyTorch on the same weights: log-probabilities and entropies with and without the adapter,
dynamic batching, the gradient of one GRPO step through Megatron's schedule (loss scaling), the
adapter export under PEFT names, save/load, and the CPU backup of the frozen base.

    pytest -m cuda_gpu tests/manual/test_megatron_core_mechanics.py   # NVIDIA, megatron-core
    pytest -m rocm_gpu tests/manual/test_megatron_core_mechanics.py   # AMD, megatron-core
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer.arguments import parse_args
from trainer.backends.base import LoraAdapter, TrainBatch
from trainer.backends.megatron import config as mc
from trainer.backends.megatron import lora_names as names
from trainer.grpo.loss import Normalizer
from trainer.loop import GRPOLoss

VOCAB, LAYERS, HIDDEN, HEADS, GROUPS, HEAD_DIM, FFN = 96, 2, 64, 4, 2, 16, 96
RANK, ALPHA, TEMPERATURE = 4, 8.0, 0.7
ARGV = [
    "--hf-checkpoint", "/unused", "--prompt-data", "/unused", "--train-backend", "megatron",
    "--rollout-backend", "sglang", "--lora-rank", str(RANK),
    "--lora-alpha", str(ALPHA), "--rollout-temperature", str(TEMPERATURE), "--lr", "0",
    "--micro-batch-size", "2", "--megatron-to-hf-mode", "raw", "--lora-base-cpu-backup",
    "--rollout-batch-size", "2", "--n-samples-per-prompt", "3", "--global-batch-size", "6",
    # Chunks of 5 rows: every batch below spans several (the log-probs never see whole logits).
    "--log-probs-chunk-size", "5", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
]  # fmt: skip


class BridgeStyleLoRA(torch.nn.Module):
    """Megatron-Bridge's ``LoRALinear`` layout: ``to_wrap`` plus ``adapter.linear_in/out``."""

    def __init__(self, to_wrap: torch.nn.Module, in_features: int, out_features: int) -> None:
        super().__init__()
        self.to_wrap = to_wrap
        self.adapter = torch.nn.Module()
        self.adapter.linear_in = torch.nn.Linear(in_features, RANK, bias=False)
        self.adapter.linear_out = torch.nn.Linear(RANK, out_features, bias=False)
        torch.nn.init.normal_(self.adapter.linear_out.weight, std=0.05)
        self.enabled = True

    def forward(self, x: torch.Tensor, *args, **kwargs):
        out, bias = self.to_wrap(x, *args, **kwargs)
        if self.enabled:
            out = out + self.adapter.linear_out(self.adapter.linear_in(x)) * (ALPHA / RANK)
        return out, bias


class Adapters:
    def __init__(self, wrappers: list[BridgeStyleLoRA]) -> None:
        self.wrappers = wrappers

    @contextlib.contextmanager
    def disable_adapter(self, model: object) -> Iterator[None]:
        for w in self.wrappers:
            w.enabled = False
        try:
            yield
        finally:
            for w in self.wrappers:
                w.enabled = True


# Tolerances against plain PyTorch on the same weights: (log-probabilities, gradient norm).
TOLERANCE = {"fp32": (1e-4, 1e-4), "bf16": (2e-2, 3e-2)}


@pytest.fixture(scope="module")
def distributed():
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture(params=["fp32", "bf16"])
def built(distributed, request):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    from trainer.backends import registry
    from trainer.backends.megatron.trainer import MegatronParts, policy_trainer

    args = parse_args([*ARGV, "--dtype", request.param])
    dtype = torch.bfloat16 if request.param == "bf16" else torch.float32
    config = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        num_query_groups=GROUPS, kv_channels=HEAD_DIM, ffn_hidden_size=FFN,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        normalization="RMSNorm", add_bias_linear=False, params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        **{k: v for k, v in mc.provider_settings(args.megatron).items() if not k.endswith("_size")},
    )  # fmt: skip
    attention = names.AttentionShape(HEADS, GROUPS, HEAD_DIM)
    shapes = {
        "linear_qkv": (HIDDEN, attention.qkv_rows),
        "linear_proj": (HEADS * HEAD_DIM, HIDDEN),
        "linear_fc1": (HIDDEN, 2 * FFN),
        "linear_fc2": (FFN, HIDDEN),
    }

    def make_model() -> tuple[torch.nn.Module, list[BridgeStyleLoRA]]:
        gpt = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(),
            vocab_size=VOCAB,
            max_sequence_length=64,
            position_embedding_type="rope",
        ).cuda()
        for p in gpt.parameters():
            p.requires_grad = False
        wrappers = []
        for layer in gpt.decoder.layers:
            for module, (n_in, n_out) in shapes.items():
                owner = (
                    layer.self_attention if module in ("linear_qkv", "linear_proj") else layer.mlp
                )
                wrapper = BridgeStyleLoRA(getattr(owner, module), n_in, n_out).to("cuda", dtype)
                setattr(owner, module, wrapper)
                wrappers.append(wrapper)
        return gpt, wrappers

    gpt, wrappers = make_model()
    reference, reference_wrappers = make_model()  # same weights, plain PyTorch autograd
    reference.load_state_dict(gpt.state_dict())
    # As Bridge's provide_distributed_model wraps: Float16Module for bf16, then DDP.
    wrapped = Float16Module(config, gpt) if dtype == torch.bfloat16 else gpt
    ddp = DistributedDataParallel(
        config=config,
        ddp_config=DistributedDataParallelConfig(**mc.ddp_settings(args.megatron)),
        module=wrapped,
    )
    optimizer_settings = mc.optimizer_settings(args.optimizer, args.placement.dtype)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(**optimizer_settings, params_dtype=dtype), [ddp]
    )
    scheduler = OptimizerParamScheduler(optimizer, **mc.scheduler_settings(args.optimizer, 4))
    targets = registry.adapter_targets(args)
    parts = MegatronParts([ddp], optimizer, scheduler, Adapters(wrappers), attention, targets)
    trainer = policy_trainer(args, "cuda:0", parts)
    return trainer, reference, Adapters(reference_wrappers), TOLERANCE[request.param], args


def _batch(lengths: list[int], seed: int) -> TrainBatch:
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(1, VOCAB, (n,), generator=gen)
        mask[row, :n] = 1
    loss_mask = mask[:, 1:].float()
    loss_mask[:, :2] = 0  # a two-token "prompt"
    return TrainBatch(input_ids=ids, attention_mask=mask, loss_mask=loss_mask)


def _reference(model: torch.nn.Module, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    ids = batch.input_ids.cuda()
    positions = torch.arange(ids.shape[1], device="cuda").expand_as(ids)
    logits = model(input_ids=ids, position_ids=positions, attention_mask=None).float()
    logp = (logits[:, :-1] / TEMPERATURE).log_softmax(-1)
    logprobs = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logprobs, entropy


def _mechanics(built) -> LoraAdapter:
    trainer, reference, reference_adapters, (close, grad_rel), config = built
    batch = _batch([9, 5, 12, 7, 3], seed=0)
    valid = batch.attention_mask[:, 1:].bool()

    with torch.no_grad():
        ref_lp, ref_ent = _reference(reference.eval(), batch)
        with reference_adapters.disable_adapter(reference):
            base_lp, _ = _reference(reference, batch)
    out = trainer.forward(batch, with_adapter=True, with_entropy=True)
    torch.testing.assert_close(out.logprobs[valid], ref_lp.cpu()[valid], rtol=close, atol=close)
    torch.testing.assert_close(out.entropy[valid], ref_ent.cpu()[valid], rtol=close, atol=close)
    off = trainer.forward(batch, with_adapter=False)
    torch.testing.assert_close(off.logprobs[valid], base_lp.cpu()[valid], rtol=close, atol=close)
    assert (off.logprobs[valid] - out.logprobs[valid]).abs().max() > 10 * close

    trainer.megatron = dataclasses.replace(
        trainer.megatron, use_dynamic_batch_size=True, max_tokens_per_gpu=24
    )
    dynamic = trainer.forward(batch, with_adapter=True)
    torch.testing.assert_close(dynamic.logprobs[valid], out.logprobs[valid], rtol=close, atol=close)

    # One GRPO step (lr 0: weights stay): Megatron's gradient equals plain autograd's, with
    # fixed micro-batches and regrouped by token budget alike.
    micro = [_batch([9, 5], 1), _batch([12, 7], 2), _batch([3, 11], 3)]
    for i, mb in enumerate(micro):
        mb.advantages = torch.tensor([[1.0], [-0.5]]) * (i + 1)
        mb.old_logprobs = trainer.forward(mb, with_adapter=True).logprobs + 0.05
    # The loss aggregation is train.py's default for this argv (as the loop builds it).
    loss_fn = GRPOLoss(
        config.algorithm.loss(config.rollout), Normalizer.from_masks(m.loss_mask for m in micro)
    )
    reference.train()
    for p in reference.parameters():
        p.grad = None
    for mb in micro:
        logprobs, entropy = _reference(reference, mb)
        cuda = TrainBatch(**{k: v.cuda() for k, v in vars(mb).items() if torch.is_tensor(v)})
        loss, _ = loss_fn(type(out)(logprobs=logprobs, entropy=entropy), cuda)
        loss.backward()
    expected = math.sqrt(
        sum(
            float(p.grad.float().square().sum())
            for p in reference.parameters()
            if p.grad is not None
        )
    )
    for dynamic_batching in (False, True):
        trainer.megatron = dataclasses.replace(
            trainer.megatron, use_dynamic_batch_size=dynamic_batching
        )
        result = trainer.train_step(micro, loss_fn)
        assert result.grad_norm == pytest.approx(expected, rel=grad_rel), dynamic_batching
        assert {"pg_loss", "pg_clipfrac", "lr"} <= set(result.metrics)
        assert result.metrics["skipped_step"] == 0.0

    exported = trainer.export_adapter()
    assert len(exported.tensors) == LAYERS * 7 * 2
    wrapper = trainer.adapters.wrappers[0]  # layer 0 linear_qkv
    torch.testing.assert_close(
        exported.tensors[names.peft_key(0, "k_proj", "A")],
        wrapper.adapter.linear_in.weight.detach().cpu(),
    )
    assert exported.config["target_modules"] == list(names.HF_MODULES)

    for p in (p for w in trainer.adapters.wrappers for p in w.adapter.parameters()):
        p.data.zero_()
    return exported


def _save_load_and_backup(trainer, exported: LoraAdapter, tmp_path: Path) -> None:
    from trainer.run.checkpoint import ADAPTER_DIR

    trainer.save(tmp_path)
    assert (tmp_path / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    for p in (p for w in trainer.adapters.wrappers for p in w.adapter.parameters()):
        p.data.normal_()
    trainer.load(tmp_path)
    assert trainer.steps == 2
    again = trainer.export_adapter()
    assert all(
        torch.equal(again.tensors[k], torch.zeros_like(v)) for k, v in exported.tensors.items()
    )

    frozen = [p for p in trainer.model[0].parameters() if not p.requires_grad]
    before = [p.detach().clone() for p in frozen]
    trainer.release_memory()
    assert all(p.numel() == 0 for p in frozen)
    trainer.resume_memory()
    assert all(torch.equal(p, b) for p, b in zip(frozen, before, strict=True))


@pytest.mark.cuda_gpu
def test_megatron_trainer_mechanics_on_an_nvidia_gpu(built, tmp_path: Path) -> None:
    exported = _mechanics(built)
    _save_load_and_backup(built[0], exported, tmp_path)


@pytest.mark.rocm_gpu
def test_megatron_trainer_mechanics_on_an_amd_gpu(built, tmp_path: Path) -> None:
    exported = _mechanics(built)
    _save_load_and_backup(built[0], exported, tmp_path)
