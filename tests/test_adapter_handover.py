"""benchmarks/adapter_handover.py: both hand-overs deliver the same adapter."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "adapter_handover.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("adapter_handover", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_flattened_bucket_rebuilds_every_tensor():
    bench = load_benchmark()
    tensors = bench.adapter()
    assert len(tensors) == 28 * 7 * 2
    flat, entries = bench.flatten(tensors)
    assert flat.dtype == torch.uint8
    assert flat.numel() == sum(t.numel() * 2 for t in tensors.values())
    for name, start, end, shape in entries:
        rebuilt = flat[start:end].view(torch.bfloat16).reshape(shape)
        assert torch.equal(rebuilt, tensors[name]), name


def test_the_benchmark_reports_both_hand_overs():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--repeats", "1"], capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "adapter: 392 tensors, 77.0 MiB (bf16)"
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["per-tensor", "flattened"]
