"""benchmarks/step_profile.py: one call under torch.profiler, summed up."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from benchmarks.step_profile import StepProfile, busy_seconds, profile_call, profile_traces


def test_the_host_operators_of_a_call_are_counted_and_ranked():
    a = torch.randn(64, 64)
    profile = profile_call(lambda: [(a @ a).relu() for _ in range(3)], cuda=False, top=2)
    assert profile.device_busy_s is None and profile.kernels == 0
    assert profile.host_ops == 6  # three matmul (mm inside is not counted again), three relu
    assert {name for name, _, calls in profile.top} == {"aten::matmul", "aten::relu"}
    assert all(calls == 3 for _, _, calls in profile.top)
    assert 0 < sum(s for _, s, _ in profile.top) <= profile.wall_s


def test_a_device_profile_gives_the_device_s_share_of_the_wall_time():
    profile = StepProfile(
        wall_s=2.0, host_ops=900, kernels=1200, device_busy_s=0.5,
        top=[("ampere_bf16_gemm", 0.25, 40)],
    )  # fmt: skip
    assert profile.lines("merged") == [
        "merged: 2.000 s, device busy 0.500 s (25%), 1200 kernels, 900 aten ops",
        "    0.2500 s     40x  ampere_bf16_gemm",
    ]


def test_overlapping_kernels_count_once_in_the_busy_time():
    assert busy_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4
    assert busy_seconds([]) == 0


def test_a_trace_s_device_work_is_summed_across_ranks(tmp_path):
    """Two ranks' traces as torch.profiler exports them (SGLang's scheduler writes
    ``*-TP-<rank>.trace.json.gz``); host events and instant events are not device work."""

    def kernel(name, ts, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    rank0 = [kernel("gemm", 0, 400), kernel("attn", 500, 100),
             kernel("copy", 650, 50, "gpu_memcpy"),
             {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 900},
             {"ph": "i", "cat": "kernel", "name": "marker", "ts": 10}]  # fmt: skip
    rank1 = [kernel("gemm", 100, 400)]
    with gzip.open(tmp_path / "TP-0.trace.json.gz", "wt") as out:
        json.dump({"traceEvents": rank0}, out)
    (tmp_path / "TP-1.trace.json").write_text(json.dumps({"traceEvents": rank1}))
    profile = profile_traces(
        [tmp_path / "TP-0.trace.json.gz", tmp_path / "TP-1.trace.json"], wall_s=0.002, top=2
    )
    assert profile.kernels == 4 and profile.host_ops is None
    assert profile.device_busy_s == pytest.approx(650e-6)  # 0-600 and 650-700
    assert profile.top == [("gemm", pytest.approx(800e-6), 2), ("attn", pytest.approx(100e-6), 1)]
    assert profile.lines("merged")[0] == "merged: 0.002 s, device busy 0.001 s (32%), 4 kernels"
