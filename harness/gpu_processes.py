"""Which GPUs each process of the node computes on, as the vendor's GPU tool reports it.

Ownership asks this for a process whose environment it cannot read (another user's): its
visibility variable is unknown, but the driver knows the devices it holds. ``amd-smi process``,
``rocm-smi --showpidgpus`` and ``nvidia-smi --query-compute-apps`` are asked in that order;
the first that answers is believed. Device ids are the tool's indices (as in
``HIP_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` on a node whose devices are in PCI order).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator

_TIMEOUT_S = 30
GpuMap = dict[int, frozenset[str]]


def gpu_processes() -> GpuMap | None:
    """pid -> the GPU ids it holds, for every compute process of the node; None when no GPU
    tool is installed or none answers."""
    for tool, ask in _TOOLS:
        if shutil.which(tool) and (found := ask()) is not None:
            return found
    return None


def _output(*argv: str) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _amd_smi() -> GpuMap | None:
    """``amd-smi process --json``: ``[{"gpu": 0, "process_list": [{"process_info": {"pid":
    ...}}]}]`` (``"process_info"`` is a sentence when the GPU runs nothing)."""
    text = _output("amd-smi", "process", "--json")
    try:
        devices = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(devices, list):
        return None
    held: dict[int, set[str]] = {}
    for device in devices:
        if isinstance(device, dict) and "gpu" in device:
            for pid in _pids(device.get("process_list")):
                held.setdefault(pid, set()).add(str(device["gpu"]))
    return {pid: frozenset(ids) for pid, ids in held.items()}


def _pids(data: object) -> Iterator[int]:
    if isinstance(data, dict):
        if isinstance(data.get("pid"), int):
            yield data["pid"]
        for value in data.values():
            yield from _pids(value)
    elif isinstance(data, list):
        for value in data:
            yield from _pids(value)


_ROCM_PID = re.compile(r"^PID (\d+) is using (\d+) DRM device\(s\):?\s*$")


def _rocm_smi() -> GpuMap | None:
    """``rocm-smi --showpidgpus``: ``PID 4567 is using 2 DRM device(s):`` and, when more than
    none, the device indices on the next line (``0 1``)."""
    text = _output("rocm-smi", "--showpidgpus")
    if text is None:
        return None
    held: GpuMap = {}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if match := _ROCM_PID.match(line.strip()):
            ids = lines[index + 1].split() if int(match[2]) and index + 1 < len(lines) else []
            held[int(match[1])] = frozenset(ids)
    return held


def _nvidia_smi() -> GpuMap | None:
    """``nvidia-smi --query-compute-apps=pid,gpu_uuid`` joined with ``--query-gpu=index,uuid``."""
    options = ("--format=csv,noheader",)
    apps = _output("nvidia-smi", "--query-compute-apps=pid,gpu_uuid", *options)
    gpus = _output("nvidia-smi", "--query-gpu=index,uuid", *options)
    if apps is None or gpus is None:
        return None
    index_of = dict(reversed(_csv_pair(line)) for line in gpus.splitlines() if line.strip())
    held: dict[int, set[str]] = {}
    for line in apps.splitlines():
        if line.strip():
            pid, uuid = _csv_pair(line)
            if pid.isdigit() and uuid in index_of:
                held.setdefault(int(pid), set()).add(index_of[uuid])
    return {pid: frozenset(ids) for pid, ids in held.items()}


def _csv_pair(line: str) -> tuple[str, str]:
    first, _, second = line.partition(",")
    return first.strip(), second.strip()


_TOOLS: tuple[tuple[str, Callable[[], GpuMap | None]], ...] = (
    ("amd-smi", _amd_smi),
    ("rocm-smi", _rocm_smi),
    ("nvidia-smi", _nvidia_smi),
)
