"""A colocated trainer's memory release: the frozen base leaves, the adapter stays."""

from __future__ import annotations

import pytest
import torch

from trainer.backends.frozen_weights import FrozenWeights


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
