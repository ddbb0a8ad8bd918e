"""benchmarks/step_profile.py: one call under torch.profiler, summed up."""

from __future__ import annotations

import torch

from benchmarks.step_profile import StepProfile, profile_call


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
