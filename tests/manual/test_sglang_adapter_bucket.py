"""Live: the adapter payloads `trainer.backends.sglang.rollout` sends with
``load_format="flattened_bucket"`` unpickle in another process exactly as SGLang's scheduler
unpickles them (``MultiprocessingSerializer.deserialize`` behind its restricted unpickler, then
``FlattenedTensorBucket.reconstruct_tensors``), once per tensor-parallel rank; a buffer on the
GPU (``--lora-serving merged``'s weights) travels as a CUDA IPC handle.

    pytest -m cuda_gpu tests/manual/test_sglang_adapter_bucket.py

Needs SGLang (0.5.17: the release whose LoRA loading takes ``load_format``) and, for the IPC
case, a GPU.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
from multiprocessing.queues import Queue

import pytest
import torch

from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.sglang.rollout import flattened_bucket_payloads


def _scheduler_side(payload: bytes, queue: Queue) -> None:
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    monkey_patch_torch_reductions()  # as the scheduler's tensor-parallel worker does first
    data = MultiprocessingSerializer.deserialize(payload)
    bucket = FlattenedTensorBucket(
        flattened_tensor=data["flattened_tensor"], metadata=data["metadata"]
    )
    # Plain bytes back: tensors would travel as shared memory this process must outlive.
    queue.put({name: _record(tensor) for name, tensor in bucket.reconstruct_tensors()})


def _record(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    return str(tensor.dtype), tuple(tensor.shape), tensor.cpu().view(torch.int16).numpy().tobytes()


@pytest.mark.cuda_gpu
@pytest.mark.parametrize(
    ("packed", "device"),
    [(False, "cpu"), (True, "cpu"), (True, "cuda")],
    ids=["dict", "flat-tensors", "flat-tensors-cuda-ipc"],
)
def test_each_ranks_payload_rebuilds_the_tensors_in_another_process(
    packed: bool, device: str
) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    generator = torch.Generator().manual_seed(0)
    tensors = {
        f"base_model.model.model.layers.{layer}.self_attn.q_proj.lora_{ab}.weight": torch.randn(
            (64, 1024) if ab == "A" else (2048, 64), generator=generator
        ).to(torch.bfloat16)
        for layer in range(4)
        for ab in "AB"
    }
    adapter = FlatTensors.pack(tensors, device=device) if packed else tensors
    context = multiprocessing.get_context("spawn")
    for payload in flattened_bucket_payloads(adapter, ranks=2):
        queue = context.Queue()
        process = context.Process(target=_scheduler_side, args=(payload, queue))
        process.start()
        rebuilt = queue.get(timeout=300)
        process.join(timeout=60)
        assert rebuilt == {name: _record(tensor) for name, tensor in tensors.items()}
