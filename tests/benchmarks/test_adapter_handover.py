"""benchmarks/adapter_handover.py: both exports deliver the same adapter."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "adapter_handover.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("adapter_handover", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_exports_give_the_adapter_in_bf16_on_the_host():
    bench = load_benchmark()
    tensors = bench.adapter()
    assert len(tensors) == 28 * 7 * 2
    per_tensor, flattened = (export(tensors) for export in bench.EXPORTS.values())
    assert list(per_tensor) == list(flattened) == list(tensors)
    for name, tensor in tensors.items():
        expected = tensor.to(torch.bfloat16)
        assert torch.equal(per_tensor[name], expected) and torch.equal(flattened[name], expected)
        assert flattened[name].device.type == "cpu"


def test_the_benchmark_reports_both_hand_overs():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "1", "--device", "cpu"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[0] == "adapter: 392 tensors, 77.0 MiB (bf16), exported from cpu"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["per-tensor", "flattened"]
