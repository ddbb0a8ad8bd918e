"""Production rollout engine: an offline ``sglang.Engine`` with LoRA, one per
``--rollout-num-gpus-per-engine`` GPUs (the engine's tensor-parallel size).

API followed: SGLang 0.5.9 (``sglang/srt/entrypoints/engine.py``): ``Engine(**server_args)``,
``generate(input_ids=..., sampling_params=..., return_logprob=True, lora_path=[...])``,
``load_lora_adapter_from_tensors(name, tensors, config_dict)`` (adapter from memory; older
releases lack it and get the adapter from a PEFT directory via ``load_lora_adapter(name,
path)``), ``unload_lora_adapter(name)``, ``release_memory_occupation(tags)`` /
``resume_memory_occupation(tags)`` (needs ``enable_memory_saver``, set with ``--colocate`` unless
``--colocate-memory keep``).

Colocated memory: with ``--lora-base-cpu-backup`` the engine runs with
``enable_weights_cpu_backup`` and releases everything (weights, KV cache, CUDA graphs) while
training runs; SGLang restores the frozen base weights from its CPU copy, so they are never sent
again (a pinned copy whose buffers its processes keep from one release to the next:
`engine_environment`). Without it the base weights stay on the GPU and only the KV cache and
CUDA graphs are released (released weights would have to be sent again). The LoRA buffers are
outside SGLang's memory-saver regions and survive either way; each rollout phase loads the new
adapter anyway. Serving merged weights, the base weights this process keeps to merge into follow
SGLang's: with the backup they leave the GPU while training runs (a pinned host copy, made once).

Adapter hand-over: SGLang passes the tensors to its scheduler process pickled with
``multiprocessing``'s ``ForkingPickler``, where every CPU tensor becomes its own shared-memory
segment whose file descriptor the scheduler fetches back over a socket from the sending
process, one round trip per tensor (392 for the 0.6B shape's all-linear adapter). Where SGLang
takes ``load_format="flattened_bucket"`` (0.5.17), the adapter travels as one flat buffer plus
its names and shapes instead (SGLang's ``FlattenedTensorBucket`` layout, what miles sends): one
segment, one round trip, whatever the adapter's size.

With ``--lora-serving merged`` the engine runs without LoRA: each adapter is merged into the
base's linear weights here (`trainer.backends.lora_merge`, on the engine's GPU) and those
weights reach SGLang through ``update_weights_from_tensor`` as one flattened bucket, a CUDA IPC
handle of the buffer rather than a copy (SGLang rebuilds the tensor on its side from the
handle); SGLang flushes its prefix cache after the update.

Each adapter load logs one line with how long packing the adapter, SGLang's load of it and its
unload of the previous one took (logger ``trainer.backends.sglang.rollout``, INFO; SGLang
configures the root logger at its log level, ``info`` unless ``--sglang-log-level`` says
otherwise): together they are most of ``time/load_adapter``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.backends import registry
from trainer.backends.base import Generation, LoraAdapter, SamplingParams
from trainer.backends.devices import empty_cache, gpu_index, torch_dtype
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.generation_parsing import (
    parse_input_logprobs,
    parse_outputs,
    sampling_params,
)
from trainer.backends.lora_merge import LoraMerger, adapted_weights
from trainer.backends.sglang.args import build_server_args

if TYPE_CHECKING:
    import torch

    from trainer.config import TrainConfig

# Packs named tensors (an adapter's, or merged weights) into the payloads
# ``load_format="flattened_bucket"`` takes: one per tensor-parallel rank of the engine.
BucketPacker = Callable[[Mapping[str, "torch.Tensor"]], list[bytes]]

# SGLang's memory-saver tags (sglang/srt/constants.py, 0.5.9).
KV_CACHE, WEIGHTS, CUDA_GRAPH = "kv_cache", "weights", "cuda_graph"


LOG = logging.getLogger(__name__)


class SGLangRolloutEngine:
    """`engine`: an ``sglang.Engine`` started with `server_args` (`start` does both).
    `pack`, where the engine takes flattened buckets, packs each adapter into them. With a
    `merger` the engine serves no adapter: each one is merged into the base weights, which
    `pack` packs to replace the engine's."""

    def __init__(
        self,
        engine: Any,
        server_args: dict[str, Any],
        *,
        pack: BucketPacker | None = None,
        merger: LoraMerger | None = None,
    ) -> None:
        if merger is not None and pack is None:
            raise ValueError("merged weights reach SGLang as flattened buckets: give a packer")
        self._engine = engine
        self._pack = pack
        self._merger = merger
        self._release_tags = (
            [KV_CACHE, WEIGHTS, CUDA_GRAPH]
            if releases_weights(server_args)
            else [KV_CACHE, CUDA_GRAPH]
        )
        # where SGLang's own weights leave the GPU, the merger's base is on it only to merge
        # (`_load_merged`): its host copy, made once, goes back for each merge and is dropped
        # after, so the rollout, KV cache and all, never holds it
        self._merger_releasing = merger if WEIGHTS in self._release_tags else None
        self._adapter_name: str | None = None
        self._names = itertools.count()
        self._released: list[str] = []  # the memory-saver tags off the device now
        self._adapter_dir = tempfile.TemporaryDirectory(prefix="sglang-lora-")

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        if self._released:
            raise RuntimeError("generate called while the rollout engine's memory is released")
        if not prompts:
            return []
        outputs = self._engine.generate(
            input_ids=[list(prompt) for prompt in prompts],
            sampling_params=sampling_params(params, len(prompts)),
            return_logprob=True,
            lora_path=[self._adapter_name] * len(prompts) if self._adapter_name else None,
        )
        return parse_outputs(prompts, outputs)

    def score(self, token_ids: Sequence[int]) -> list[list[float]]:
        """A prefill of `token_ids` with input log-probabilities (one token generated, unused)."""
        if self._released:
            raise RuntimeError("score called while the rollout engine's memory is released")
        output = self._engine.generate(
            input_ids=list(token_ids),
            sampling_params={"max_new_tokens": 1, "temperature": 1.0},
            return_logprob=True,
            logprob_start_len=0,
            lora_path=self._adapter_name,
        )
        vocab_size = self._engine.tokenizer_manager.model_config.vocab_size
        return [parse_input_logprobs(token_ids, output, vocab_size)]

    def load_adapter(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` from now on: load it under a fresh name, then drop the previous one
        (merged: replace the weights it covers with their merged values)."""
        if self._merger is not None:
            self._load_merged(adapter)
            return
        name = f"policy-v{adapter.version}-{next(self._names)}"
        config = dict(adapter.config)
        started = packed = time.perf_counter()
        if self._pack is not None:
            payloads = self._pack(adapter.tensors)
            packed = time.perf_counter()
            result = self._engine.load_lora_adapter_from_tensors(
                name, payloads, config, load_format="flattened_bucket"
            )
        elif hasattr(self._engine, "load_lora_adapter_from_tensors"):
            tensors = {key: tensor.contiguous() for key, tensor in adapter.tensors.items()}
            result = self._engine.load_lora_adapter_from_tensors(name, tensors, config)
        else:
            result = self._engine.load_lora_adapter(name, str(self._write(name, adapter)))
        if not getattr(result, "success", True):
            raise RuntimeError(f"SGLang could not load LoRA adapter {name}: {result.error_message}")
        loaded = time.perf_counter()
        previous, self._adapter_name = self._adapter_name, name
        if previous is not None:
            self._engine.unload_lora_adapter(previous)
        LOG.info(
            "adapter %s: %d tensors packed in %.3f s, loaded in %.3f s, previous %s unloaded in "
            "%.3f s",
            name, len(adapter.tensors), packed - started, loaded - packed, previous or "(none)",
            time.perf_counter() - loaded,
        )  # fmt: skip

    def borrow_base(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Merge into the trainer's base weights on this GPU (`shared_base`) instead of a copy
        read from the checkpoint."""
        if self._merger is None:
            raise ValueError("an engine serving the adapter merges nothing: it borrows no base")
        self._merger.borrow(weights)

    def _load_merged(self, adapter: LoraAdapter) -> None:
        started = time.perf_counter()
        if self._merger_releasing is not None:
            self._merger_releasing.restore()
        merged = self._merger.merge(adapter)
        payloads = self._pack(merged)
        packed = time.perf_counter()
        success, message = self._engine.update_weights_from_tensor(
            payloads, load_format="flattened_bucket", flush_cache=True
        )
        if not success:
            raise RuntimeError(f"SGLang could not take the merged weights: {message}")
        count = len(merged)
        # SGLang copied them: their buffer goes back to the device, not to this process's
        # cache, where a colocated trainer in another process could not use it
        del merged, payloads
        if self._merger_releasing is not None:
            self._merger_releasing.release()  # the base too (its host copy kept)
        else:
            empty_cache(self._merger.device)
        LOG.info(
            "adapter v%d merged into %d weights in %.3f s, loaded in %.3f s",
            adapter.version, count, packed - started, time.perf_counter() - packed,
        )  # fmt: skip

    def _write(self, name: str, adapter: LoraAdapter) -> Path:
        import torch
        from safetensors.torch import save_file

        path = Path(self._adapter_dir.name) / name
        path.mkdir()
        # Own contiguous copies: safetensors refuses tensors that share memory (a
        # `FlatTensors`' views) and strided ones.
        tensors = {
            key: tensor.clone(memory_format=torch.contiguous_format)
            for key, tensor in adapter.tensors.items()
        }
        save_file(tensors, str(path / "adapter_model.safetensors"))
        (path / "adapter_config.json").write_text(json.dumps(dict(adapter.config)))
        return path

    def release_memory(self) -> None:
        self._engine.release_memory_occupation(tags=self._release_tags)
        self._released = list(self._release_tags)

    def resume_weights(self) -> None:
        """SGLang's weights back, where they were released; the KV cache and CUDA graphs stay
        released until `resume_memory`."""
        if WEIGHTS in self._released:
            self._resume([WEIGHTS])

    def resume_memory(self) -> None:
        self._resume(self._released)

    def _resume(self, tags: list[str]) -> None:
        if not tags:
            return
        self._engine.resume_memory_occupation(tags=list(tags))
        self._released = [tag for tag in self._released if tag not in tags]

    @contextmanager
    def device_profile(self, output_dir: Path) -> Iterator[list[Path]]:
        """SGLang's own torch.profiler trace of what its schedulers run on the GPU inside the
        block (kernels and copies only: no host events, no stacks, so little overhead), one
        ``*.trace.json.gz`` per rank in `output_dir`; the list it yields holds their paths
        once the block has ended."""
        output_dir.mkdir(parents=True, exist_ok=True)
        before = set(output_dir.glob("*.trace.json.gz"))
        traces: list[Path] = []
        self._engine.start_profile(
            output_dir=str(output_dir), activities=["GPU"], with_stack=False, record_shapes=False
        )
        try:
            yield traces
        finally:
            self._engine.stop_profile()  # returns once every rank has written its trace
            traces += sorted(set(output_dir.glob("*.trace.json.gz")) - before)

    def shutdown(self) -> None:
        self._engine.shutdown()
        self._adapter_dir.cleanup()


def create(config: TrainConfig, device: str, *, engine_index: int = 0) -> SGLangRolloutEngine:
    """Engine `engine_index`, whose first GPU is `device` (``cuda:<index>``), spanning
    ``--rollout-num-gpus-per-engine`` consecutive GPUs."""
    server_args = build_server_args(
        config,
        registry.adapter_targets(config),
        base_gpu_id=gpu_index(device),
        engine_index=engine_index,
    )
    return start(server_args, merger=merger_for(config, device, server_args))


def merger_for(config: TrainConfig, device: str, server_args: dict[str, Any]) -> LoraMerger | None:
    """The merger of an engine serving merged weights (``--lora-serving merged``; none serving
    the adapter). Where the engine's weights leave the GPU (`releases_weights`), the merge base
    goes with them: it is read onto the host now, as the engine starts, not in the first
    update."""
    if not config.lora.merged:
        return None
    checkpoint = config.checkpoint.hf_checkpoint
    merger = LoraMerger.from_checkpoint(
        checkpoint, device=device, dtype=torch_dtype(config.placement.resolve_dtype(device))
    )
    if releases_weights(server_args):
        merger.keep_on_host(adapted_weights(checkpoint, registry.adapter_targets(config).hf))
    return merger


def releases_weights(server_args: dict[str, Any]) -> bool:
    """Whether the engine's weights leave the GPU with its KV cache (``--lora-base-cpu-backup``:
    SGLang keeps a host copy of them), and so the merge base with them."""
    return bool(server_args.get("enable_weights_cpu_backup"))


def engine_environment(server_args: dict[str, Any]) -> dict[str, str]:
    """What SGLang's scheduler processes must find in their environment as they start. Where
    the engine's weights leave the GPU with a host copy (`releases_weights`), torch_memory_saver
    keeps that copy's pinned buffers from one release to the next (``TMS_RETAIN_CPU_BACKUP``,
    which it reads once, as the process starts); without it every release pins the weights'
    size of host memory anew (7.7 GiB at the Qwen3-4B shape) and frees it at resume."""
    return {"TMS_RETAIN_CPU_BACKUP": "1"} if releases_weights(server_args) else {}


@contextmanager
def environment_set(variables: Mapping[str, str]) -> Iterator[None]:
    """`variables` in ``os.environ`` inside the block (for the processes started there), the
    previous values back after it."""
    previous = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def start(server_args: dict[str, Any], *, merger: LoraMerger | None = None) -> SGLangRolloutEngine:
    import sglang

    with environment_set(engine_environment(server_args)):
        engine = sglang.Engine(**server_args)
    pack = bucket_packer(engine, server_args, merged=merger is not None)
    return SGLangRolloutEngine(engine, server_args, pack=pack, merger=merger)


def bucket_packer(
    engine: Any, server_args: dict[str, Any], *, merged: bool = False
) -> BucketPacker | None:
    """The packer for `engine`: for merged weights (``update_weights_from_tensor`` takes
    flattened buckets), or where its adapter loading takes them; else None."""
    load = getattr(engine, "load_lora_adapter_from_tensors", None)
    takes_buckets = load is not None and "load_format" in inspect.signature(load).parameters
    if not (merged or takes_buckets):
        return None
    return functools.partial(flattened_bucket_payloads, ranks=server_args.get("tp_size", 1))


def flattened_bucket_payloads(tensors: Mapping[str, torch.Tensor], *, ranks: int) -> list[bytes]:
    """`tensors` as one SGLang ``FlattenedTensorBucket`` (its buffer and its own metadata class,
    which the scheduler's restricted unpickler accepts), serialized once per tensor-parallel
    rank: each rank unpickles its own copy, and a shared-memory segment's descriptor (or a
    CUDA buffer's IPC handle) can be taken once per pickle. A `FlatTensors` already is the
    bucket's buffer: no copy."""
    import torch
    from sglang.srt.utils import MultiprocessingSerializer
    from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata

    flat = tensors if isinstance(tensors, FlatTensors) else FlatTensors.pack(tensors)
    if flat.buffer.is_cuda:
        # SGLang's pickling of CUDA tensors names the GPU by UUID, not by an index that
        # differs between processes with different CUDA_VISIBLE_DEVICES; its scheduler reads
        # it so (its weight_sync helpers patch the sender alike).
        monkey_patch_torch_reductions()
    metadata = [
        FlattenedTensorMetadata(
            name=entry.name,
            shape=torch.Size(entry.shape),
            dtype=entry.dtype,
            start_idx=entry.start,
            end_idx=entry.end,
            numel=entry.end - entry.start,
        )
        for entry in flat.entries
    ]
    data = {"flattened_tensor": flat.buffer, "metadata": metadata}
    return [MultiprocessingSerializer.serialize(data) for _ in range(ranks)]
