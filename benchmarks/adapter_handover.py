"""How long a LoRA adapter takes from the trainer's device to another process: the trainer's
export (cast to bf16, copy to the host) and the step between SGLang's
`Engine.load_lora_adapter_from_tensors` and its scheduler, measured without SGLang.

SGLang pickles the adapter with `multiprocessing`'s `ForkingPickler` (its
`MultiprocessingSerializer`) and the scheduler process unpickles it and keeps host copies.
*per-tensor* exports each tensor to the host on its own and hands over the dict of them, as the
PEFT trainer and our SGLang engine did until 2026-12-04; *flattened* packs the adapter into one
`FlatTensors` buffer on the device, copies that once to the host and hands over the one buffer
(the shape of SGLang's ``load_format="flattened_bucket"``, what miles uses). The adapter is the
benchmark's 0.6B shape (28 layers, hidden 1024, intermediate 3072, 16/8 heads of 128), LoRA r64
on all linear layers, a float32 master copy on `--device`, exported in bf16: 392 tensors,
77 MiB. Reported: the median of `--repeats` hand-overs after one warm-up, each timed from the
export's start to the receiver's acknowledgement.

    python benchmarks/adapter_handover.py                  # on the GPU where there is one
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import pickle
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.backends.flat_tensors import FlatTensors

LAYERS, RANK = 28, 64
SHAPES = {  # module: (in features, out features)
    "q_proj": (1024, 2048),
    "k_proj": (1024, 1024),
    "v_proj": (1024, 1024),
    "o_proj": (2048, 1024),
    "gate_proj": (1024, 3072),
    "up_proj": (1024, 3072),
    "down_proj": (3072, 1024),
}


def adapter(device: str = "cpu") -> dict[str, torch.Tensor]:
    """The trainer's float32 master copy of the adapter, on `device`."""
    tensors = {}
    for layer in range(LAYERS):
        for module, (fan_in, fan_out) in SHAPES.items():
            name = f"model.layers.{layer}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, fan_in, device=device)
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, RANK, device=device)
    return tensors


def per_tensor(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.to(torch.bfloat16).to("cpu", copy=True) for n, t in tensors.items()}


def flattened(tensors: Mapping[str, torch.Tensor]) -> FlatTensors:
    return FlatTensors.pack({n: t.to(torch.bfloat16) for n, t in tensors.items()}, device="cpu")


Export = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
EXPORTS: dict[str, Export] = {
    "per-tensor": per_tensor,
    "flattened": flattened,
}


def receive(connection: Connection) -> None:
    """The scheduler's side: unpickle, read every tensor, acknowledge with their count."""
    while data := connection.recv_bytes():
        tensors = pickle.loads(data)
        count = sum(1 for tensor in tensors.values() if tensor.numel())
        connection.send_bytes(str(count).encode())


def hand_over(connection: Connection, export: Export, tensors: Mapping[str, torch.Tensor]) -> float:
    start = time.perf_counter()
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(export(tensors))
    connection.send_bytes(buffer.getvalue())
    connection.recv_bytes()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    tensors = adapter(args.device)
    mib = sum(t.numel() * 2 for t in tensors.values()) / 2**20
    print(f"adapter: {len(tensors)} tensors, {mib:.1f} MiB (bf16), exported from {args.device}")
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    receiver = context.Process(target=receive, args=(theirs,))
    receiver.start()
    for name, export in EXPORTS.items():
        times = [hand_over(ours, export, tensors) for _ in range(args.repeats + 1)][1:]
        print(f"{name:>10}: median {statistics.median(times):.3f} s over {args.repeats}")
    ours.send_bytes(b"")
    receiver.join()


if __name__ == "__main__":
    main()
