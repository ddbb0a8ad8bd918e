"""One call under torch.profiler: how long the device computed of its wall time, how many
kernels the host launched for it, and which took the longest.

A step whose device is busy for a small share of its wall time is bound by the host (Python,
operator dispatch, kernel launches), not by the device: making kernels faster would not shorten
it. The profiler's own overhead lengthens the host side, so the share is a lower bound.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StepProfile:
    wall_s: float
    host_ops: int  # top-level aten operators the host dispatched
    kernels: int  # kernels (and copies) launched on the device; 0 on the CPU
    device_busy_s: float | None  # their durations summed; None on the CPU
    top: list[tuple[str, float, int]]  # (name, seconds, calls): device kernels, else host ops

    def lines(self, name: str) -> list[str]:
        if self.device_busy_s is None:
            head = f"{name}: {self.wall_s:.3f} s on the CPU, {self.host_ops} aten ops"
        else:
            busy = self.device_busy_s / self.wall_s if self.wall_s else 0.0
            head = (
                f"{name}: {self.wall_s:.3f} s, device busy {self.device_busy_s:.3f} s "
                f"({busy:.0%}), {self.kernels} kernels, {self.host_ops} aten ops"
            )
        return [head] + [f"  {s:8.4f} s {calls:6d}x  {label[:90]}" for label, s, calls in self.top]


def profile_call(call: Callable[[], object], *, cuda: bool, top: int = 8) -> StepProfile:
    """Runs `call` once under the profiler (CPU, and CUDA where `cuda`)."""
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
    kernels = [event for event in events if event.device_type == DeviceType.CUDA]
    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for event in kernels if cuda else top_level:
        seconds[event.name] += (
            event.time_range.elapsed_us() if cuda else event.cpu_time_total
        ) / 1e6
        calls[event.name] += 1
    busy = sum(kernel.time_range.elapsed_us() for kernel in kernels) / 1e6 if cuda else None
    return StepProfile(
        wall_s=wall,
        host_ops=len(top_level),
        kernels=len(kernels),
        device_busy_s=busy,
        top=[(name, s, calls[name]) for name, s in seconds.most_common(top)],
    )
