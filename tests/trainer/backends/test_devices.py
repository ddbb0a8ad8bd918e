"""Device helpers shared by the backends."""

from __future__ import annotations

import pytest
import torch

from trainer.backends.devices import gpu_index, host_copies


@pytest.mark.parametrize(("device", "index"), [("cuda", 0), ("cuda:5", 5), ("cpu", 0)])
def test_gpu_index(device: str, index: int) -> None:
    assert gpu_index(device) == index


def test_host_copies_are_one_buffer_reused_while_the_tensors_keep_their_layout() -> None:
    """Copies of every tensor in one host allocation; copied into again where the names,
    dtypes and shapes are the same, a new one where they are not."""
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.bfloat16)}
    copies = host_copies(tensors, "cpu")
    assert copies.keys() == tensors.keys() and len(copies.buffer) >= 6 * 4 + 4 * 2
    for name, tensor in tensors.items():
        assert torch.equal(copies[name], tensor)
        assert copies[name].data_ptr() != tensor.data_ptr()
    tensors["a"] += 1
    assert host_copies(tensors, "cpu", reuse=copies) is copies
    assert torch.equal(copies["a"], tensors["a"])
    fewer = host_copies({"a": tensors["a"]}, "cpu", reuse=copies)
    assert fewer is not copies and list(fewer) == ["a"]
