"""The Megatron trainer built by Megatron-Bridge with Transformer Engine, on one NVIDIA GPU.

What the production job relies on, checked at the trainer's interface in a few seconds:
`megatron_trainer.create` (``AutoBridge`` from a local Hugging Face folder, Bridge's LoRA on all
linear layers, Megatron's DDP and distributed optimizer) gives the log-probs transformers gives
on the same weights; one GRPO step moves the adapter (``skipped_step`` 0); the adapter exported
by Bridge (``--megatron-to-hf-mode bridge``) equals the project's own conversion (``raw``); that
adapter, saved and loaded into PEFT + transformers, gives the trainer's log-probs; save/load and
the colocated release/resume of the frozen base leave the policy as it was.

    pytest -m cuda_gpu tests/manual/test_megatron_bridge.py -s

Model: `trainer.tiny`'s ``qwen3-0.6b`` shape (random weights), bf16.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from tests.support.private_ray import free_port
from trainer import tiny
from trainer.arguments import parse_args
from trainer.backends.base import TrainBatch
from trainer.grpo.loss import Normalizer
from trainer.loop import GRPOLoss
from trainer.run.checkpoint import ADAPTER_DIR

CLOSE = 0.03  # bf16, Transformer Engine's kernels against transformers' (the seed's threshold)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    for module in ("megatron.bridge", "transformer_engine.pytorch"):
        pytest.importorskip(module, reason=f"{module} is not installed")
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    import torch.distributed as dist

    from trainer.backends.megatron import trainer as megatron_trainer

    root = tmp_path_factory.mktemp("bridge")
    tiny.build(root / "model", root / "data", seed=0, shape="qwen3-0.6b", device="cuda")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1)
    args = parse_args(
        [
            "--hf-checkpoint", str(root / "model"), "--prompt-data", str(root / "data"),
            "--train-backend", "megatron", "--rollout-backend", "sglang",
            "--megatron-to-hf-mode", "bridge", "--lora-rank", "16", "--lora-alpha", "32",
            "--target-modules", "all-linear", "--lr", "1e-3", "--dtype", "bf16",
            "--use-dynamic-batch-size", "--max-tokens-per-gpu", "256",
            "--log-probs-chunk-size", "64", "--lora-base-cpu-backup",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
        ]
    )  # fmt: skip
    built = megatron_trainer.create(args, "cuda:0", total_steps=4)
    yield built, root, args
    dist.destroy_process_group()


def _batch(seed: int, lengths: list[int]) -> TrainBatch:
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    vocab = len(tiny.vocabulary())
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(4, vocab, (n,), generator=gen)
        mask[row, :n] = 1
    loss_mask = mask[:, 1:].float()
    loss_mask[:, :4] = 0  # a four-token prompt
    return TrainBatch(input_ids=ids, attention_mask=mask, loss_mask=loss_mask)


def _hf_logprobs(model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    ids, mask = batch.input_ids.cuda(), batch.attention_mask.cuda()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1).cpu()


def _diff(a: torch.Tensor, b: torch.Tensor, batch: TrainBatch) -> float:
    scored = batch.loss_mask > 0
    return float((a[scored] - b[scored]).abs().mean())


@pytest.mark.cuda_gpu
def test_bridge_trainer_matches_transformers_trains_exports_and_restores(trainer, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy, root, config = trainer
    batch = _batch(0, [40, 33, 57, 21])
    hf = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.bfloat16).cuda()
    before = policy.forward(batch, with_adapter=True).logprobs
    assert _diff(before, _hf_logprobs(hf, batch), batch) < CLOSE  # B = 0: the base policy

    micro = [_batch(1, [30, 45]), _batch(2, [52, 26])]
    for i, mb in enumerate(micro):
        mb.advantages = torch.tensor([[1.0], [-1.0]]) * (i + 1)
        mb.old_logprobs = policy.forward(mb, with_adapter=True).logprobs
    loss = GRPOLoss(
        config.algorithm.loss(config.rollout), Normalizer.from_masks(m.loss_mask for m in micro)
    )
    for _ in range(2):
        result = policy.train_step(micro, loss)
        assert result.grad_norm > 0 and result.metrics["skipped_step"] == 0.0, result
    after = policy.forward(batch, with_adapter=True).logprobs
    base = policy.forward(batch, with_adapter=False).logprobs
    assert _diff(after, base, batch) > CLOSE  # the adapter moved the policy
    assert _diff(base, before, batch) < 1e-6  # and only through the adapter

    bridge = policy.export_adapter()
    policy.megatron = dataclasses.replace(policy.megatron, megatron_to_hf_mode="raw")
    raw = policy.export_adapter()
    policy.megatron = dataclasses.replace(policy.megatron, megatron_to_hf_mode="bridge")
    assert set(bridge.tensors) == set(raw.tensors)
    for name, tensor in bridge.tensors.items():
        torch.testing.assert_close(tensor.float(), raw.tensors[name].float(), msg=name)

    policy.save(tmp_path)
    peft = PeftModel.from_pretrained(hf, tmp_path / ADAPTER_DIR).eval()
    assert _diff(_hf_logprobs(peft, batch), after, batch) < CLOSE

    policy.release_memory()
    policy.resume_memory()
    policy.load(tmp_path)
    again = policy.forward(batch, with_adapter=True).logprobs
    assert _diff(again, after, batch) < 1e-6
