"""A colocated trainer's memory release: the frozen base leaves, the adapter stays."""

from __future__ import annotations

import pytest
import torch

from trainer.backends.frozen_weights import FrozenWeights, OptimizerState


def lora_like_model() -> torch.nn.Module:
    """Tied embedding/head (frozen, shared), a frozen body and a trainable adapter."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {
            "embed": torch.nn.Embedding(11, 4),
            "body": torch.nn.Linear(4, 4),
            "head": torch.nn.Linear(4, 11, bias=False),
            "adapter": torch.nn.Linear(4, 4, bias=False),
        }
    )
    model["head"].weight = model["embed"].weight
    for name in ("embed", "body", "head"):
        model[name].requires_grad_(False)
    return model


def test_backup_frees_the_base_and_restores_it_bit_for_bit():
    model = lora_like_model()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    frozen = FrozenWeights(model.parameters(), torch.device("cpu"), cpu_backup=True)
    frozen.release()
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    assert sizes["embed.weight"] == sizes["body.weight"] == sizes["body.bias"] == 0
    assert sizes["adapter.weight"] == 16  # adapter-sized state stays where it is
    frozen.restore()
    frozen.release()  # the copy is made once; later rounds only free and restore
    frozen.restore()
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert model["head"].weight is model["embed"].weight


def test_without_backup_the_weights_stay():
    model = lora_like_model()
    frozen = FrozenWeights(model.parameters(), torch.device("cpu"), cpu_backup=False)
    frozen.release()
    assert all(p.numel() > 0 for p in model.parameters())
    frozen.restore()


def test_release_and_restore_must_alternate():
    frozen = FrozenWeights(lora_like_model().parameters(), torch.device("cpu"), cpu_backup=True)
    with pytest.raises(RuntimeError, match="without resume_memory"):
        frozen.release()
        frozen.release()
    frozen.restore()
    with pytest.raises(RuntimeError, match="without release_memory"):
        frozen.restore()


def adam_after_one_step(model: torch.nn.Module) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model["adapter"](torch.ones(2, 4)).sum().backward()
    optimizer.step()
    return optimizer


def test_the_optimizer_state_leaves_and_comes_back_as_it_was():
    """Adam's moments go to one host buffer made once and come back; the next step is the one
    it would have been without the round trip."""
    released, kept = lora_like_model(), lora_like_model()
    optimizer, reference = adam_after_one_step(released), adam_after_one_step(kept)
    offload = OptimizerState(optimizer, torch.device("cpu"))
    (state,) = optimizer.state.values()
    moments = {key: state[key] for key in ("exp_avg", "exp_avg_sq")}
    offload.release()
    for key, moment in moments.items():
        assert state[key] is not moment and torch.equal(state[key], moment)  # copied out
    # one buffer, for the moments and, all on a CPU here, the step count
    assert offload.host is not None and len(offload.host) == len(state)
    host = offload.host
    buffers = {key: state[key].data_ptr() for key in moments}
    offload.restore()
    for optim, model in ((optimizer, released), (reference, kept)):
        model["adapter"](torch.ones(2, 4)).sum().backward()
        optim.step()
    offload.release()
    assert offload.host is host  # reused
    assert all(state[key].data_ptr() == buffers[key] for key in moments)
    offload.restore()
    torch.testing.assert_close(released["adapter"].weight, kept["adapter"].weight, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="without release_memory"):
        offload.restore()
