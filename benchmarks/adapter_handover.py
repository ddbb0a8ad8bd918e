"""How long handing a LoRA adapter to another process takes: the step between SGLang's
`Engine.load_lora_adapter_from_tensors` and its scheduler, measured without SGLang.

SGLang pickles the adapter's tensors with `multiprocessing`'s `ForkingPickler` (its
`MultiprocessingSerializer`) and the scheduler process unpickles them and keeps CPU copies.
*per-tensor* hands over the adapter's dict of tensors as our SGLang engine does now;
*flattened* hands over one uint8 tensor plus (name, start, end, shape) entries, the shape of
SGLang's ``load_format="flattened_bucket"`` (what miles uses). The adapter is the benchmark's
0.6B shape (28 layers, hidden 1024, intermediate 3072, 16/8 heads of 128), LoRA r64 on all
linear layers, bf16: 392 tensors, 77 MiB. Reported: the median of `--repeats` hand-overs after
one warm-up, each timed from pickling to the receiver's acknowledgement.

    python benchmarks/adapter_handover.py
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import pickle
import statistics
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler

import torch

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

Flattened = tuple[torch.Tensor, list[tuple[str, int, int, tuple[int, ...]]]]


def adapter() -> dict[str, torch.Tensor]:
    tensors = {}
    for layer in range(LAYERS):
        for module, (fan_in, fan_out) in SHAPES.items():
            name = f"model.layers.{layer}.{module}"
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, fan_in, dtype=torch.bfloat16)
            tensors[f"{name}.lora_B.weight"] = torch.randn(fan_out, RANK, dtype=torch.bfloat16)
    return tensors


def flatten(tensors: dict[str, torch.Tensor]) -> Flattened:
    parts, entries, start = [], [], 0
    for name, tensor in tensors.items():
        part = tensor.flatten().view(torch.uint8)
        parts.append(part)
        entries.append((name, start, start + part.numel(), tuple(tensor.shape)))
        start += part.numel()
    return torch.cat(parts), entries


def receive(connection: Connection) -> None:
    """The scheduler's side: unpickle, rebuild named CPU tensors, acknowledge."""
    while data := connection.recv_bytes():
        payload = pickle.loads(data)
        if isinstance(payload, tuple):
            flat, entries = payload
            tensors = {n: flat[a:b].view(torch.bfloat16).reshape(s) for n, a, b, s in entries}
        else:
            tensors = payload
        connection.send_bytes(str(len(tensors)).encode())


def hand_over(connection: Connection, payload: object) -> float:
    start = time.perf_counter()
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(payload)
    connection.send_bytes(buffer.getvalue())
    connection.recv_bytes()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    tensors = adapter()
    mib = sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20
    print(f"adapter: {len(tensors)} tensors, {mib:.1f} MiB (bf16)")
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    receiver = multiprocessing.get_context("spawn").Process(target=receive, args=(theirs,))
    receiver.start()
    variants = {"per-tensor": lambda: tensors, "flattened": lambda: flatten(tensors)}
    for name, payload in variants.items():
        times = [hand_over(ours, payload()) for _ in range(args.repeats + 1)][1:]
        print(f"{name:>10}: median {statistics.median(times):.3f} s over {args.repeats}")
    ours.send_bytes(b"")
    receiver.join()


if __name__ == "__main__":
    main()
