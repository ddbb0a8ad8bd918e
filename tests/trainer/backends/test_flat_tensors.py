"""`FlatTensors`: named tensors packed into one byte buffer, read back as views."""

from __future__ import annotations

import pickle

import pytest
import torch

from trainer.backends.flat_tensors import ALIGNMENT, FlatTensors


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "odd.bf16": torch.randn(3, 5, generator=generator).to(torch.bfloat16),  # 30 bytes
        "fp32": torch.randn(4, 2, generator=generator),
        "transposed": torch.randn(2, 3, generator=generator).t(),  # not contiguous
        "int64": torch.arange(7),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }


def test_packed_tensors_read_back_equal_in_dtype_shape_and_order() -> None:
    tensors = _tensors()
    flat = FlatTensors.pack(tensors)
    assert list(flat) == list(tensors) and len(flat) == len(tensors)
    for name, tensor in tensors.items():
        view = flat[name]
        assert view.dtype == tensor.dtype and view.shape == tensor.shape
        assert torch.equal(view, tensor), name
        assert view.data_ptr() % ALIGNMENT == 0, name  # each view aligned for its dtype
    assert flat.buffer.dtype == torch.uint8 and flat.buffer.dim() == 1


def test_packing_copies_so_later_changes_to_the_sources_do_not_reach_it() -> None:
    tensors = _tensors()
    before = {name: tensor.clone() for name, tensor in tensors.items()}
    flat = FlatTensors.pack(tensors)
    for tensor in tensors.values():
        tensor.add_(1)
    assert all(torch.equal(flat[name], before[name]) for name in before)


def test_it_pickles_as_one_buffer_where_a_dict_of_its_views_pickles_it_per_tensor() -> None:
    names = [f"layer.{i}.lora_A.weight" for i in range(16)]
    flat = FlatTensors.pack({name: torch.zeros(64, 256) for name in names})  # 64 KiB each
    size = flat.buffer.numel()
    once = pickle.dumps(flat)
    assert size < len(once) < size * 1.05
    assert len(pickle.dumps(dict(flat))) > 10 * size  # what packing avoids
    again = pickle.loads(once)
    assert isinstance(again, FlatTensors) and list(again) == names
    assert all(torch.equal(again[name], flat[name]) for name in names)


def test_packing_puts_the_buffer_on_the_device_asked_for() -> None:
    flat = FlatTensors.pack(_tensors(), device="meta")
    assert flat.buffer.device.type == "meta"
    assert flat["fp32"].shape == (4, 2)


def test_a_buffer_that_is_not_flat_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="1-D contiguous uint8"):
        FlatTensors(torch.zeros(4, dtype=torch.float32), ())
    with pytest.raises(ValueError, match="1-D contiguous uint8"):
        FlatTensors(torch.zeros(2, 4, dtype=torch.uint8), ())
