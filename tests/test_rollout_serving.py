"""benchmarks/rollout_serving.py without a GPU: its adapter and its usage errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.grpo_vs_trl import Spec
from benchmarks.rollout_serving import random_adapter
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.lora_merge import lora_layers, lora_scaling

ROOT = Path(__file__).resolve().parents[1]


def test_the_random_adapter_covers_every_linear_layer():
    spec = Spec(
        work="", device="cuda", tiny=False, prompts=8, samples=8, prompt_len=256,
        response_len=512, micro_batch=16, lr=2e-5, seed=1, rollout_backend="sglang",
    )  # fmt: skip
    adapter = random_adapter(spec, seed=1)
    layers = lora_layers(adapter.tensors)
    assert len(layers) == 28 * 7
    assert lora_scaling(adapter.config) == 0.5
    q = layers[0]
    assert q.weight == "model.layers.0.self_attn.q_proj.weight"
    assert adapter.tensors[q.a].shape == (64, 1024) and adapter.tensors[q.b].shape == (2048, 64)
    assert all(t.dtype == torch.bfloat16 for t in adapter.tensors.values())
    assert isinstance(adapter.tensors, FlatTensors)  # packed as the PEFT trainer exports it


def test_unknown_serving_is_a_usage_error():
    result = subprocess.run(
        [sys.executable, "benchmarks/rollout_serving.py", "--serving", "lora"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--serving: a comma list of adapter, merged" in result.stderr


def test_a_variant_needs_a_new_name_and_an_equals_sign():
    for argv in (["--variant", "compile"], ["--variant", "a=", "--variant", "a=--x"]):
        result = subprocess.run(
            [sys.executable, "benchmarks/rollout_serving.py", *argv],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert result.returncode == 2
        assert "expected a new NAME=FLAGS" in result.stderr.strip().splitlines()[-1]


def test_variants_keep_their_order_and_split_their_flags():
    import argparse

    from benchmarks.rollout_serving import parse_variants

    given = ["base=", "compile=--sglang-enable-torch-compile --sglang-torch-compile-max-bs 64"]
    assert parse_variants(argparse.ArgumentParser(), given) == {
        "base": [],
        "compile": ["--sglang-enable-torch-compile", "--sglang-torch-compile-max-bs", "64"],
    }
