"""benchmarks/rollout_serving.py without a GPU: its adapter, its profiled generate call and its
usage errors."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from benchmarks.rollout_serving import profiled_generate, random_adapter
from benchmarks.workload import Spec
from trainer.backends.base import SamplingParams
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.lora_merge import lora_layers, lora_scaling

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a CUDA GPU")
def test_without_a_cuda_gpu_it_says_so_before_it_runs():
    result = subprocess.run(
        [sys.executable, "benchmarks/rollout_serving.py"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("error: it runs SGLang's engine on a CUDA GPU: none is visible here")
    )


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


class TracingEngine:
    """A rollout engine whose device profiler writes one rank's trace when the block ends."""

    def __init__(self) -> None:
        self.generated: list[list[list[int]]] = []

    @contextmanager
    def device_profile(self, directory: Path) -> Iterator[list[Path]]:
        traces: list[Path] = []
        yield traces
        trace = directory / "TP-0.trace.json.gz"
        kernels = [{"ph": "X", "cat": "kernel", "name": "decode", "ts": 10 * i, "dur": 4}
                   for i in range(5)]  # fmt: skip
        with gzip.open(trace, "wt") as out:
            json.dump({"traceEvents": kernels}, out)
        traces.append(trace)

    def generate(self, prompts: list[list[int]], params: object) -> list[object]:
        self.generated.append(prompts)
        return []


def test_the_profiled_generate_sums_the_engine_s_trace(tmp_path):
    engine = TracingEngine()
    profile = profiled_generate(engine, [[1, 2]], SamplingParams(max_new_tokens=4), tmp_path)
    assert engine.generated == [[[1, 2]]]
    assert profile.kernels == 5 and profile.device_busy_s == pytest.approx(20e-6)
    assert profile.top == [("decode", pytest.approx(20e-6), 5)]
    assert profile.wall_s > 0 and profile.host_ops is None
