"""A system's peak memory while it steps (`PeakMemory`), and the device's memory in use."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class PeakMemory:
    """Peak memory of this process tree while its system takes a step (`watch` to `pause`),
    sampled every 20 ms. On CUDA: NVML's per-process usage (SGLang's scheduler processes
    included); where NVML reports process ids of another namespace (containers), the device's
    used memory above `baseline` instead, which then also holds the other system's idle tensors.
    On the CPU: the resident set. `peak_own`: this process's share at the moment of the peak
    (the rest is its children's: SGLang's scheduler, vLLM's workers), where usage is per
    process. `peak_by_phase`: the peak within each phase the system names (`phase`: its
    rollout, its training), samples outside every named phase under `REST`.

    Between steps the sampler rests: side by side, the systems step in turn, and an idle
    system's sampler would only load the host (NVML's process list and a walk of ``/proc``, 50
    times a second) under the one being timed. The process tree is listed again at each `watch`
    and at most once a second while watching."""

    INTERVAL_S = 0.02
    PIDS_MAX_AGE_S = 1.0
    REST = "rest"

    def __init__(self, device: str, baseline: int) -> None:
        import psutil

        self.cuda = device.startswith("cuda")
        self.baseline = baseline
        self.process = psutil.Process()
        self.peak = 0
        self.peak_own = 0
        self.peak_by_phase: dict[str, int] = {}
        self.per_process = not self.cuda
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the sampler's and `pause`'s samples, `_watching`
        self._watching = False
        self._phases: list[str] = []  # the named phases entered, innermost last
        self._pids: set[int] = set()
        self._pids_at = float("-inf")
        self._handle: Any = None
        if self.cuda:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> set[int]:
        if time.monotonic() - self._pids_at > self.PIDS_MAX_AGE_S:
            children = self.process.children(recursive=True)
            self._pids = {self.process.pid, *(c.pid for c in children)}
            self._pids_at = time.monotonic()
        return self._pids

    def sample(self) -> tuple[int, int]:
        """Bytes in use by the process tree, and by this process alone (0 where unknown)."""
        pids = self._tree()
        if not self.cuda:
            import psutil

            used = {}
            for pid in pids:
                try:
                    used[pid] = psutil.Process(pid).memory_info().rss
                except psutil.NoSuchProcess:
                    continue
            return sum(used.values()), used.get(self.process.pid, 0)
        import pynvml

        used = {
            p.pid: p.usedGpuMemory or 0
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            if p.pid in pids
        }
        self.per_process = self.per_process or bool(used)
        if self.per_process:
            return sum(used.values()), used.get(self.process.pid, 0)
        return pynvml.nvmlDeviceGetMemoryInfo(self._handle).used - self.baseline, 0

    def _record(self) -> None:
        try:
            total, own = self.sample()
        except Exception:  # a process that ended between listing and reading it
            return
        if total > self.peak:
            self.peak, self.peak_own = total, own
        phase = self._phases[-1] if self._phases else self.REST
        if total > self.peak_by_phase.get(phase, -1):
            self.peak_by_phase[phase] = total

    def watch(self) -> None:
        """A step begins: sample until `pause`."""
        with self._lock:
            self._pids_at = float("-inf")
            self._watching = True

    def pause(self) -> None:
        """The step has ended: one last sample, then none until the next `watch`."""
        with self._lock:
            self._watching = False
            self._record()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Within, samples count as phase `name`'s (phases nest: the innermost counts); one
        sample as it begins and one as it ends, so that a phase shorter than the interval has
        its own."""
        with self._lock:
            if self._watching:
                self._record()
            self._phases.append(name)
        try:
            yield
        finally:
            with self._lock:
                if self._watching:
                    self._record()
                self._phases.pop()

    def idle(self) -> None:
        """Between steps (untimed): hand cached blocks back to the device, so that the systems
        stepping in turn find the memory another one's caching allocator would hold (three side
        by side overflowed an H200: 2026-12-04), and without per-process numbers the other
        systems' samples count only this one's live tensors."""
        if self.cuda:
            import torch

            torch.cuda.empty_cache()

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            with self._lock:
                if self._watching:
                    self._record()

    def reset(self) -> None:
        with self._lock:
            self.peak = self.peak_own = 0
            self.peak_by_phase = {}

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def device_used(device: str) -> int:
    """Bytes in use on GPU 0 (0 on the CPU)."""
    if not device.startswith("cuda"):
        return 0
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
