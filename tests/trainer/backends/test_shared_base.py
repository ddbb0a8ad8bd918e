"""The trainer's frozen base lent to the engine merging on its GPU (`shared_base`)."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from trainer.arguments import parse_args
from trainer.backends import shared_base

MERGED_KEPT = (
    "--hf-checkpoint", "m", "--prompt-data", "p.jsonl", "--colocate", "--colocate-memory",
    "keep", "--lora-serving", "merged", "--rollout-backend", "sglang",
)  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "device", "lends"),
    [
        ((), "cuda", True),
        # released, SGLang gives back its KV cache and graphs only: both bases stay
        (("--colocate-memory", "release"), "cuda", True),
        # the trainer's base goes to the host during rollouts
        (("--colocate-memory", "release", "--lora-base-cpu-backup"), "cuda", False),
        # the transformers engine moves its model and merge base to the host when released
        (("--colocate-memory", "release", "--rollout-backend", "hf"), "cuda", False),
        (("--rollout-backend", "hf"), "cuda", True),
        ((), "cpu", False),
        (("--lora-serving", "adapter"), "cuda", False),  # nothing merged
        (("--actor-num-gpus-per-node", "2"), "cuda", False),  # one GPU only
        (("--rollout-num-gpus-per-engine", "2", "--actor-num-gpus-per-node", "2"), "cuda", False),
    ],
)
def test_the_trainer_lends_its_base_only_to_one_engine_on_its_one_gpu_where_it_stays_there(
    extra, device, lends
):
    config = parse_args([*MERGED_KEPT, *extra])
    assert shared_base.lends_base(config, device) is lends


def test_an_engine_on_its_own_gpus_borrows_nothing():
    argv = [a for a in MERGED_KEPT if a not in ("--colocate", "--colocate-memory", "keep")]
    config = parse_args([*argv, "--rollout-num-gpus", "1"])
    assert not shared_base.lends_base(config, "cuda")


def write_into_the_lent_tensor(payload: bytes) -> None:
    """In another process: the lent tensor, mapped, written to."""
    [(name, weight)] = shared_base.unpack(payload).items()
    assert name == "model.layers.0.mlp.up_proj.weight"
    weight.fill_(7.0)


def test_the_lent_tensors_reach_another_process_as_the_same_memory_not_a_copy():
    """What the borrower maps is the lender's memory: a write there shows here (on the CPU as
    shared memory; on a GPU the same pickling carries CUDA IPC handles)."""
    weight = torch.zeros(4, 3)
    payload = shared_base.pack({"model.layers.0.mlp.up_proj.weight": weight})
    child = multiprocessing.get_context("spawn").Process(
        target=write_into_the_lent_tensor, args=(payload,)
    )
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    assert torch.equal(weight, torch.full((4, 3), 7.0))
