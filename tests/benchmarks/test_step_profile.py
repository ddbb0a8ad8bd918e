"""benchmarks/step_profile.py: one call under torch.profiler, summed up."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from benchmarks.step_profile import (
    StepProfile,
    busy_seconds,
    main,
    profile_call,
    profile_traces,
)


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


def test_traced_steps_divide_the_trace_s_span_and_kernels_by_the_steps(tmp_path, capsys):
    """Two decode steps of 10 ms each, the device busy for 6 of every 10."""
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0, "dur": 5}]
    for step in (0, 10_000):
        events += [
            {"ph": "X", "cat": "kernel", "name": "nvjet_gemm", "ts": step + 1000, "dur": 4000},
            {"ph": "X", "cat": "kernel", "name": "flash_fwd", "ts": step + 5000, "dur": 2000},
        ]
    events.append({"ph": "X", "cat": "cpu_op", "name": "sample", "ts": 19_000, "dur": 1000})
    trace = tmp_path / "decode.trace.json.gz"
    with gzip.open(trace, "wt") as out:
        json.dump({"traceEvents": events}, out)
    main([str(trace), "--steps", "2", "--top", "1"])
    assert capsys.readouterr().out.splitlines() == [
        "per step (2 in the traces' 0.0200 s): wall 10.000 ms, device busy 6.000 ms (60%), "
        "2 kernels",
        "     4.000 ms     1.0x  nvjet_gemm",
    ]


def test_a_missing_trace_is_one_line_of_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "none.json")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"no such trace: {tmp_path}/none.json")


def test_a_trace_without_timed_events_is_one_line_of_error(tmp_path):
    trace = tmp_path / "empty.json"
    trace.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name"}]}))
    with pytest.raises(SystemExit, match=f"^step_profile: no timed events in {trace}$"):
        main([str(trace)])
