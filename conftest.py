"""Root pytest configuration: manual GPU markers skip with a reason on other hardware."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def _accelerator() -> tuple[str | None, str]:
    """(vendor, device name) of the first visible accelerator, or (None, reason)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "no GPU is visible to torch"
    vendor = "amd" if torch.version.hip else "nvidia"
    return vendor, torch.cuda.get_device_name(0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, vendor in (("rocm_gpu", "amd"), ("cuda_gpu", "nvidia")):
            if marker not in item.keywords:
                continue
            found, name = _accelerator()
            if found != vendor:
                reason = name if found is None else f"needs a {vendor} GPU, found {name}"
                item.add_marker(pytest.mark.skip(reason=f"{marker}: {reason}"))
