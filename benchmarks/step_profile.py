"""Where a step's time goes: how long the device computed of its wall time, how many kernels
were launched for it, and which took the longest. From torch.profiler run around a call in this
process (`profile_call`), or from the chrome traces another process wrote, e.g. SGLang's
scheduler through ``Engine.start_profile`` (`profile_traces`). From the command line, per step of
the traces given (``python3 benchmarks/step_profile.py TRACE... --steps N``), e.g. the decode steps
``python -m sglang.bench_one_batch --profile --profile-stage decode --profile-steps N`` traced.

A step whose device is busy for a small share of its wall time is bound by the host (Python,
operator dispatch, scheduling, kernel launches), not by the device: faster kernels would not
shorten it. The profiler's own overhead lengthens the host side, so the share is a lower bound.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# chrome-trace categories of work on the device (torch.profiler's Kineto export)
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


@dataclass(frozen=True)
class StepProfile:
    wall_s: float
    host_ops: int | None  # top-level aten operators dispatched; None where not recorded
    kernels: int  # kernels and copies run on the device; 0 on the CPU
    device_busy_s: float | None  # time the device was running any of them; None on the CPU
    top: list[tuple[str, float, int]]  # (name, seconds, calls): device kernels, else host ops

    def lines(self, name: str) -> list[str]:
        ops = "" if self.host_ops is None else f", {self.host_ops} aten ops"
        if self.device_busy_s is None:
            head = f"{name}: {self.wall_s:.3f} s on the CPU{ops}"
        else:
            busy = self.device_busy_s / self.wall_s if self.wall_s else 0.0
            head = (
                f"{name}: {self.wall_s:.3f} s, device busy {self.device_busy_s:.3f} s "
                f"({busy:.0%}), {self.kernels} kernels{ops}"
            )
        return [head] + [f"  {s:8.4f} s {calls:6d}x  {label[:90]}" for label, s, calls in self.top]


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals, in their unit: kernels on several
    streams overlap and count once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def ranked(named: Iterable[tuple[str, float]], top: int) -> list[tuple[str, float, int]]:
    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for name, duration in named:
        seconds[name] += duration
        calls[name] += 1
    return [(name, s, calls[name]) for name, s in seconds.most_common(top)]


def profile_call(call: Callable[[], object], *, cuda: bool, top: int = 8) -> StepProfile:
    """Runs `call` once under torch.profiler (CPU, and CUDA where `cuda`)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
    events = prof.events()
    top_level = [
        event
        for event in events
        if event.device_type == DeviceType.CPU
        and event.name.startswith("aten::")
        and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::"))
    ]
    if not cuda:
        host = ranked(((e.name, e.cpu_time_total / 1e6) for e in top_level), top)
        return StepProfile(wall, len(top_level), 0, None, host)
    kernels = [event for event in events if event.device_type == DeviceType.CUDA]
    spans = [(k.time_range.start / 1e6, k.time_range.end / 1e6) for k in kernels]
    return StepProfile(
        wall_s=wall,
        host_ops=len(top_level),
        kernels=len(kernels),
        device_busy_s=busy_seconds(spans),
        top=ranked(((k.name, k.time_range.elapsed_us() / 1e6) for k in kernels), top),
    )


def trace_events(paths: Sequence[Path]) -> list[dict]:
    """The complete ("X") events of chrome traces (``.json`` or ``.json.gz``)."""
    events = []
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as trace:
            events += [e for e in json.load(trace).get("traceEvents", []) if e.get("ph") == "X"]
    return events


def profile_traces(paths: Sequence[Path], *, wall_s: float, top: int = 8) -> StepProfile:
    """The device work in chrome traces (``.json`` or ``.json.gz``, one per rank: busy time is
    their union) recorded during `wall_s` seconds."""
    return device_profile(trace_events(paths), wall_s=wall_s, top=top)


def device_profile(events: Sequence[dict], *, wall_s: float, top: int) -> StepProfile:
    events = [event for event in events if event.get("cat") in DEVICE_CATEGORIES]
    spans = [(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events]
    return StepProfile(
        wall_s=wall_s,
        host_ops=None,
        kernels=len(events),
        device_busy_s=busy_seconds(spans),
        top=ranked(((e["name"], e["dur"] / 1e6) for e in events), top),
    )


def traced_steps(paths: Sequence[Path], *, steps: int, top: int) -> list[str]:
    """Per step, in milliseconds: the wall time the traces span (their first event's start to
    the last one's end, host and device), the device's busy time, and the longest kernels."""
    events = trace_events(paths)
    start = min((e["ts"] for e in events), default=0)
    span_s = (max((e["ts"] + e.get("dur", 0) for e in events), default=0) - start) / 1e6
    if span_s <= 0:
        raise SystemExit(f"step_profile: no timed events in {', '.join(map(str, paths))}")
    profile = device_profile(events, wall_s=span_s, top=top)
    busy = profile.device_busy_s or 0.0
    head = (
        f"per step ({steps} in the traces' {span_s:.4f} s): wall {1e3 * span_s / steps:.3f} ms, "
        f"device busy {1e3 * busy / steps:.3f} ms ({busy / span_s:.0%}), "
        f"{profile.kernels / steps:.0f} kernels"
    )
    return [head] + [
        f"  {1e3 * s / steps:8.3f} ms {calls / steps:7.1f}x  {label[:100]}"
        for label, s, calls in profile.top
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Where the time of the steps in torch.profiler chrome traces went, e.g. "
        "SGLang's decode under `python -m sglang.bench_one_batch --profile --profile-stage "
        "decode --profile-steps N`."
    )
    parser.add_argument("traces", nargs="+", type=Path, help="chrome traces, .json or .json.gz")
    parser.add_argument("--steps", type=int, default=1, help="steps the traces hold")
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    options = parser.parse_args(argv)
    missing = [str(path) for path in options.traces if not path.is_file()]
    if missing:
        parser.error(f"no such trace: {', '.join(missing)}")
    if options.steps < 1:
        parser.error("--steps counts the traced steps: 1 or more")
    print("\n".join(traced_steps(options.traces, steps=options.steps, top=options.top)))


if __name__ == "__main__":
    main()
