"""Device helpers shared by the backends."""

from __future__ import annotations

import pytest

from trainer.backends.devices import gpu_index


@pytest.mark.parametrize(("device", "index"), [("cuda", 0), ("cuda:5", 5), ("cpu", 0)])
def test_gpu_index(device: str, index: int) -> None:
    assert gpu_index(device) == index
