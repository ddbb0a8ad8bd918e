"""The hardware registry: every accelerator a launcher may declare, and name matching."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from harness.errors import LaunchError

Vendor = Literal["amd", "nvidia", "cpu"]


@dataclass(frozen=True)
class Hardware:
    name: str
    vendor: Vendor
    arch: str
    gpus_per_node: int
    memory_gib: int

    @property
    def platform(self) -> Literal["rocm", "cuda", "cpu"]:
        return {"amd": "rocm", "nvidia": "cuda", "cpu": "cpu"}[self.vendor]  # type: ignore[return-value]

    @property
    def device(self) -> Literal["cpu", "cuda"]:
        """The device a training rank computes on: ``cpu`` without GPUs, else ``cuda`` (ROCm's
        torch calls its GPUs cuda too)."""
        return "cuda" if self.gpus_per_node else "cpu"

    def describe(self) -> str:
        if self.device == "cpu":
            return f"{self.name} (no GPU)"
        return (
            f"{self.name} ({self.vendor} {self.arch}, {self.gpus_per_node} GPUs per node, "
            f"{self.memory_gib} GiB per GPU)"
        )


REGISTRY: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        Hardware("MI300X", "amd", "gfx942", 8, 192),
        Hardware("MI325X", "amd", "gfx942", 8, 256),
        Hardware("MI350X", "amd", "gfx950", 8, 288),
        Hardware("MI355X", "amd", "gfx950", 8, 288),
        Hardware("H100", "nvidia", "sm_90", 8, 80),
        Hardware("H200", "nvidia", "sm_90", 8, 141),
        Hardware("B200", "nvidia", "sm_100", 8, 180),
        Hardware("CPU", "cpu", "cpu", 0, 0),
    )
}


def get_hardware(name: str) -> Hardware:
    try:
        return REGISTRY[name]
    except KeyError:
        raise LaunchError(f"unknown hardware {name!r} (known: {', '.join(REGISTRY)})") from None


def match_hardware(description: str) -> Hardware | None:
    """The registry entry named in a device description (``AMD Instinct MI355X``, ...).

    None when no entry, or more than one, is named as a whole word: a mixed or unknown node
    must be declared explicitly.
    """
    found = {
        hw.name
        for hw in REGISTRY.values()
        if hw.gpus_per_node
        and re.search(rf"(?<![A-Z0-9]){hw.name}(?![A-Z0-9])", description, re.IGNORECASE)
    }
    return REGISTRY[found.pop()] if len(found) == 1 else None
