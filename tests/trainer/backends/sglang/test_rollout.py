"""The SGLang rollout engine's adapter hand-over and memory calls, against a recording stand-in
for ``sglang.Engine`` (the real one needs a GPU: tests/manual)."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from trainer import tiny
from trainer.arguments import parse_args
from trainer.backends import registry
from trainer.backends.base import LoraAdapter, SamplingParams
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.lora_merge import LoraMerger, lora_layers
from trainer.backends.sglang import args as sglang_args
from trainer.backends.sglang.rollout import (
    SGLangRolloutEngine,
    bucket_packer,
    merger_for,
    start,
)

CONFIG = {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"], "peft_type": "LORA"}


def _adapter(version: int, value: float = 1.0) -> LoraAdapter:
    names = ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
             "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")  # fmt: skip
    tensors = {name: torch.full((2, 4), value).t() for name in names}  # not contiguous
    return LoraAdapter(tensors=tensors, config=CONFIG, version=version)


class StandInEngine:
    """What SGLangRolloutEngine calls of ``sglang.Engine`` besides loading, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_load: str | None = None

    def _result(self) -> Any:
        return SimpleNamespace(success=not self.fail_load, error_message=self.fail_load or "")

    def unload_lora_adapter(self, name: str) -> None:
        self.calls.append(("unload", name))

    def generate(self, *, input_ids, sampling_params, return_logprob, lora_path) -> list[dict]:
        self.calls.append(("generate", lora_path))
        meta = {"finish_reason": {"type": "length"}, "completion_tokens": 1,
                "output_token_logprobs": [(-0.5, 7, None)]}  # fmt: skip
        return [{"output_ids": [7], "meta_info": meta} for _ in input_ids]

    def release_memory_occupation(self, tags: list[str]) -> None:
        self.calls.append(("release", tuple(tags)))

    def resume_memory_occupation(self, tags: list[str]) -> None:
        self.calls.append(("resume", tuple(tags)))


class RecordingEngine(StandInEngine):
    """SGLang 0.5.9 and later: adapters from memory."""

    def load_lora_adapter_from_tensors(self, name: str, tensors: dict, config: dict) -> Any:
        assert all(t.is_contiguous() for t in tensors.values())
        self.calls.append(("load", name, sorted(tensors), config))
        return self._result()


class BucketEngine(StandInEngine):
    """SGLang 0.5.17: adapters from memory, also as flattened buckets."""

    def load_lora_adapter_from_tensors(
        self, name: str, tensors: Any, config: dict, load_format: str | None = None
    ) -> Any:
        self.calls.append(("load", name, tensors, config, load_format))
        return self._result()


class PathOnlyEngine(StandInEngine):
    """An SGLang release without ``load_lora_adapter_from_tensors``: adapters from a directory."""

    def load_lora_adapter(self, name: str, path: str) -> Any:
        self.calls.append(("load_path", name, path))
        return self._result()


def test_each_update_loads_under_a_fresh_name_before_the_previous_is_unloaded() -> None:
    sglang = RecordingEngine()
    engine = SGLangRolloutEngine(sglang, {})
    params = SamplingParams(max_new_tokens=1)
    engine.generate([[1, 2]], params)
    engine.load_adapter(_adapter(1))
    engine.generate([[1, 2], [3]], params)
    engine.load_adapter(_adapter(2))
    engine.generate([[1, 2]], params)
    kinds = [(c[0], c[1]) for c in sglang.calls]
    assert kinds == [
        ("generate", None),
        ("load", "policy-v1-0"),
        ("generate", ["policy-v1-0", "policy-v1-0"]),
        ("load", "policy-v2-1"),
        ("unload", "policy-v1-0"),  # only once the new one serves
        ("generate", ["policy-v2-1"]),
    ]
    assert sglang.calls[1][3] == CONFIG


def test_a_failed_load_raises_with_sglangs_reason_and_keeps_serving_the_previous() -> None:
    sglang = RecordingEngine()
    engine = SGLangRolloutEngine(sglang, {})
    engine.load_adapter(_adapter(1))
    sglang.fail_load = "rank 128 exceeds --max-lora-rank 64"
    with pytest.raises(RuntimeError, match="policy-v2-1: rank 128 exceeds --max-lora-rank 64"):
        engine.load_adapter(_adapter(2))
    engine.generate([[1]], SamplingParams(max_new_tokens=1))
    assert ("unload", "policy-v1-0") not in sglang.calls
    assert sglang.calls[-1] == ("generate", ["policy-v1-0"])


def test_each_load_logs_how_long_loading_and_unloading_took(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = SGLangRolloutEngine(RecordingEngine(), {})
    with caplog.at_level(logging.INFO, logger="trainer.backends.sglang.rollout"):
        engine.load_adapter(_adapter(1))
        engine.load_adapter(_adapter(2))
    first, second = (r.getMessage() for r in caplog.records)
    assert first.startswith("adapter policy-v1-0: 2 tensors packed in ")
    assert ", loaded in " in first
    assert ", previous (none) unloaded in " in first
    assert "previous policy-v1-0 unloaded in " in second


def test_with_a_packer_the_adapter_goes_as_its_flattened_bucket_payloads() -> None:
    packed: list[dict[str, torch.Tensor]] = []

    def pack(tensors: Any) -> list[bytes]:
        packed.append(dict(tensors))
        return [b"rank-0", b"rank-1"]

    sglang = BucketEngine()
    engine = SGLangRolloutEngine(sglang, {}, pack=pack)
    adapter = _adapter(4, value=0.5)
    engine.load_adapter(adapter)
    assert sglang.calls == [("load", "policy-v4-0", [b"rank-0", b"rank-1"], CONFIG,
                             "flattened_bucket")]  # fmt: skip
    (tensors,) = packed
    assert tensors.keys() == adapter.tensors.keys()
    assert all(torch.equal(t, adapter.tensors[k]) for k, t in tensors.items())


def test_flattened_buckets_only_where_the_engine_takes_a_load_format() -> None:
    assert bucket_packer(RecordingEngine(), {"tp_size": 2}) is None
    assert bucket_packer(PathOnlyEngine(), {}) is None
    packer = bucket_packer(BucketEngine(), {"tp_size": 2})
    assert isinstance(packer, functools.partial)
    assert packer.keywords == {"ranks": 2}  # one payload per tensor-parallel rank


@pytest.mark.parametrize("flat", [False, True], ids=["dict", "flat-tensors"])
def test_without_loading_from_tensors_the_adapter_goes_through_a_peft_directory(
    flat: bool,
) -> None:
    sglang = PathOnlyEngine()
    engine = SGLangRolloutEngine(sglang, {})
    adapter = _adapter(3, value=0.25)
    if flat:  # views of one buffer, which safetensors would refuse as shared memory
        adapter = replace(adapter, tensors=FlatTensors.pack(adapter.tensors))
    engine.load_adapter(adapter)
    ((kind, name, path),) = sglang.calls
    assert (kind, name) == ("load_path", "policy-v3-0")
    saved = load_file(f"{path}/adapter_model.safetensors")
    assert saved.keys() == adapter.tensors.keys()
    assert all(torch.equal(saved[k], adapter.tensors[k]) for k in saved)
    with open(f"{path}/adapter_config.json") as f:
        assert json.load(f) == CONFIG


@pytest.mark.parametrize(
    ("server_args", "tags"),
    [
        ({"enable_weights_cpu_backup": True}, ("kv_cache", "weights", "cuda_graph")),
        ({}, ("kv_cache", "cuda_graph")),  # released weights would have to be sent again
    ],
)
def test_release_frees_the_weights_only_with_their_cpu_backup(
    server_args: dict[str, Any], tags: tuple[str, ...]
) -> None:
    sglang = RecordingEngine()
    engine = SGLangRolloutEngine(sglang, server_args)
    engine.release_memory()
    with pytest.raises(RuntimeError, match="released"):
        engine.generate([[1]], SamplingParams(max_new_tokens=1))
    engine.resume_memory()
    engine.generate([[1]], SamplingParams(max_new_tokens=1))
    assert sglang.calls == [("release", tags), ("resume", tags), ("generate", None)]


@pytest.mark.parametrize(
    ("server_args", "before", "seen"),
    [
        ({"enable_weights_cpu_backup": True}, None, "1"),
        ({"enable_weights_cpu_backup": True}, "0", "1"),
        ({}, None, None),  # no host copy to keep
    ],
)
def test_an_engine_whose_weights_leave_the_gpu_keeps_their_pinned_host_copy_between_releases(
    monkeypatch: pytest.MonkeyPatch,
    server_args: dict[str, Any],
    before: str | None,
    seen: str | None,
) -> None:
    """torch_memory_saver reads ``TMS_RETAIN_CPU_BACKUP`` as SGLang's scheduler process starts:
    the engine is made with it set, and this process's environment is as it was after."""
    made: list[str | None] = []

    class Engine:
        def __init__(self, **server_args: Any) -> None:
            made.append(os.environ.get("TMS_RETAIN_CPU_BACKUP"))

    monkeypatch.setitem(sys.modules, "sglang", SimpleNamespace(Engine=Engine))
    if before is None:
        monkeypatch.delenv("TMS_RETAIN_CPU_BACKUP", raising=False)
    else:
        monkeypatch.setenv("TMS_RETAIN_CPU_BACKUP", before)
    start(server_args)
    assert made == [seen]
    assert os.environ.get("TMS_RETAIN_CPU_BACKUP") == before


class WeightsEngine(StandInEngine):
    """SGLang 0.5.17 serving merged weights: ``update_weights_from_tensor``."""

    def update_weights_from_tensor(
        self, payloads: list[bytes], load_format: str | None = None, flush_cache: bool = True
    ) -> tuple[bool, str]:
        self.calls.append(("update", payloads, load_format, flush_cache))
        return (not self.fail_load, self.fail_load or "Success")


class StubMerger:
    device = "cpu"

    def __init__(self) -> None:
        self.merged: list[LoraAdapter] = []
        self.calls: list[str] = []
        self.borrowed: dict[str, torch.Tensor] = {}

    def borrow(self, weights: dict[str, torch.Tensor]) -> None:
        self.borrowed.update(weights)

    def merge(self, adapter: LoraAdapter) -> FlatTensors:
        self.merged.append(adapter)
        self.calls.append("merge")
        return FlatTensors.pack({"model.layers.0.self_attn.q_proj.weight": torch.ones(4, 4)})

    def release(self) -> None:
        self.calls.append("release")

    def restore(self) -> None:
        self.calls.append("restore")


@pytest.mark.parametrize(
    ("server_args", "calls"),
    [({"enable_weights_cpu_backup": True}, ["restore", "merge", "release"]), ({}, ["merge"])],
)
def test_where_sglangs_weights_leave_the_gpu_the_merge_base_is_on_it_only_to_merge(
    server_args: dict[str, Any], calls: list[str]
) -> None:
    """Its host copy comes back for each merge and is dropped after: a rollout at 8,192-token
    responses has the 6.8 GiB (Qwen3-4B) for its KV cache; without the CPU backup SGLang's
    weights and the merge base stay resident."""
    merger = StubMerger()
    engine = SGLangRolloutEngine(WeightsEngine(), server_args, pack=lambda t: [b""], merger=merger)
    engine.release_memory()
    engine.resume_weights()
    assert merger.calls == []
    engine.load_adapter(_adapter(2))
    engine.resume_memory()
    engine.release_memory()
    assert merger.calls == calls


@pytest.mark.parametrize("backup", [True, False], ids=["weights-released", "weights-resident"])
def test_an_engine_whose_weights_leave_the_gpu_reads_its_merge_base_as_it_starts(
    tmp_path: Path, backup: bool
) -> None:
    """With ``--lora-base-cpu-backup`` the merge base is on the host before any update: the
    weights the trainer's adapter covers, no others (the first update then restores it as the
    later ones do, and reads no checkpoint in a step). With SGLang's weights resident the base
    is read onto the GPU by the first merge and stays there."""
    tiny.build(tmp_path / "model", tmp_path / "data", seed=1)
    argv = [
        "--hf-checkpoint", str(tmp_path / "model"),
        "--prompt-data", str(tmp_path / "data" / "train.jsonl"),
        "--rollout-backend", "sglang", "--train-backend", "torch", "--lora-serving", "merged",
        "--colocate", "--colocate-memory", "release", "--sglang-mem-fraction-static", "0.4",
        *(["--lora-base-cpu-backup"] if backup else []),
    ]  # fmt: skip
    config = parse_args(argv)
    fields, source = sglang_args.static_fields()
    targets = registry.adapter_targets(config)
    server_args = sglang_args.build_server_args(config, targets, fields=fields, source=source)
    merger = merger_for(config, "cpu", server_args)
    trainer = registry.create_trainer(config, "cpu", total_steps=1)
    covered = {layer.weight for layer in lora_layers(trainer.export_adapter().tensors)}
    assert merger is not None and merger.base == {}
    assert merger.host.keys() == (covered if backup else set())


@pytest.mark.parametrize(
    ("server_args", "weights", "rest"),
    [
        (
            {"enable_weights_cpu_backup": True},
            [("resume", ("weights",))],
            ("kv_cache", "cuda_graph"),
        ),
        ({}, [], ("kv_cache", "cuda_graph")),  # the weights never left
    ],
)
def test_merged_weights_are_loaded_before_the_kv_cache_comes_back(
    server_args: dict[str, Any], weights: list[tuple], rest: tuple[str, ...]
) -> None:
    """The merged buffer (6.8 GiB at Qwen3-4B) is made while SGLang's KV cache is still
    released: beside it, at a fraction of 0.85 for 8,192-token responses, it did not fit."""
    sglang, merger = WeightsEngine(), StubMerger()
    engine = SGLangRolloutEngine(sglang, server_args, pack=lambda t: [b"merged"], merger=merger)
    engine.release_memory()
    sglang.calls.clear()
    engine.resume_weights()
    with pytest.raises(RuntimeError, match="released"):
        engine.generate([[1]], SamplingParams(max_new_tokens=1))
    engine.load_adapter(_adapter(2))
    engine.resume_memory()
    engine.generate([[1]], SamplingParams(max_new_tokens=1))
    assert sglang.calls == [
        *weights,
        ("update", [b"merged"], "flattened_bucket", True),
        ("resume", rest),
        ("generate", None),
    ]


def test_merged_the_adapter_replaces_the_weights_and_no_adapter_is_named() -> None:
    packed: list[list[str]] = []

    def pack(tensors: Any) -> list[bytes]:
        packed.append(list(tensors))
        return [b"rank-0"]

    sglang, merger = WeightsEngine(), StubMerger()
    engine = SGLangRolloutEngine(sglang, {}, pack=pack, merger=merger)
    adapter = _adapter(2)
    engine.load_adapter(adapter)
    engine.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    assert merger.merged == [adapter]
    assert packed == [["model.layers.0.self_attn.q_proj.weight"]]
    assert sglang.calls == [
        ("update", [b"rank-0"], "flattened_bucket", True),  # the prefix cache is stale
        ("generate", None),
    ]


def test_merged_the_engine_merges_into_the_base_it_borrows() -> None:
    merger = StubMerger()
    engine = SGLangRolloutEngine(WeightsEngine(), {}, pack=lambda t: [b""], merger=merger)
    lent = {"model.layers.0.self_attn.q_proj.weight": torch.ones(4, 4)}
    engine.borrow_base(lent)
    assert merger.borrowed == lent
    serving_the_adapter = SGLangRolloutEngine(WeightsEngine(), {})
    with pytest.raises(ValueError, match="borrows no base"):
        serving_the_adapter.borrow_base(lent)


def test_released_without_the_weights_backup_every_merge_reads_the_lent_base_itself() -> None:
    """``release`` without ``--lora-base-cpu-backup`` (`shared_base.lends_base`): SGLang gives
    back its KV cache and CUDA graphs only, and each update merges from the trainer's tensor
    itself: never read from a checkpoint, never copied to the host, never dropped."""
    name = "model.layers.0.self_attn.q_proj.weight"
    lent = {name: torch.arange(16.0).reshape(4, 4)}

    def no_checkpoint(names: list[str]) -> dict[str, torch.Tensor]:
        raise AssertionError(f"read {names} from the checkpoint")

    merger = LoraMerger(no_checkpoint, "cpu", torch.float32)
    served: list[torch.Tensor] = []

    def pack(tensors: Any) -> list[bytes]:
        served.append(tensors[name].clone())
        return [b"merged"]

    sglang = WeightsEngine()
    engine = SGLangRolloutEngine(sglang, {}, pack=pack, merger=merger)
    engine.release_memory()  # as the colocation starts: the trainer's turn
    engine.borrow_base(lent)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    for version in (1, 2):
        a, b = torch.full((2, 4), float(version)), torch.full((4, 2), 0.5)
        adapter = LoraAdapter(
            {f"{prefix}.lora_A.weight": a, f"{prefix}.lora_B.weight": b}, CONFIG, version
        )
        engine.resume_weights()
        engine.load_adapter(adapter)
        engine.resume_memory()
        engine.release_memory()
        assert merger.base[name] is lent[name] and merger.host == {}
        torch.testing.assert_close(served[-1], lent[name] + 2.0 * b @ a)  # alpha 4 / r 2
    released = [call for call in sglang.calls if call[0] == "release"]
    assert released == [("release", ("kv_cache", "cuda_graph"))] * 3


def test_a_failed_weight_update_raises_with_sglangs_reason() -> None:
    sglang = WeightsEngine()
    engine = SGLangRolloutEngine(sglang, {}, pack=lambda t: [b""], merger=StubMerger())
    sglang.fail_load = "shape mismatch"
    with pytest.raises(RuntimeError, match="merged weights: shape mismatch"):
        engine.load_adapter(_adapter(1))


def test_merged_weights_always_travel_as_flattened_buckets() -> None:
    with pytest.raises(ValueError, match="packer"):
        SGLangRolloutEngine(WeightsEngine(), {}, merger=StubMerger())
    packer = bucket_packer(RecordingEngine(), {"tp_size": 2}, merged=True)
    assert isinstance(packer, functools.partial) and packer.keywords == {"ranks": 2}


class ProfilingEngine(RecordingEngine):
    """SGLang's profiler: the scheduler writes its trace when profiling stops."""

    def start_profile(self, **request: Any) -> None:
        self.calls.append(("start_profile", request))
        self.output_dir = Path(request["output_dir"])

    def stop_profile(self) -> None:
        self.calls.append(("stop_profile",))
        (self.output_dir / "1764900000-TP-0.trace.json.gz").write_bytes(b"")


def test_a_device_profile_is_sglangs_gpu_trace_of_the_block(tmp_path) -> None:
    sglang = ProfilingEngine()
    engine = SGLangRolloutEngine(sglang, {})
    (tmp_path / "old-TP-0.trace.json.gz").write_bytes(b"")  # an earlier block's
    with engine.device_profile(tmp_path) as traces:
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=1))
        assert traces == []
    assert traces == [tmp_path / "1764900000-TP-0.trace.json.gz"]
    request = {"output_dir": str(tmp_path), "activities": ["GPU"], "with_stack": False,
               "record_shapes": False}  # fmt: skip
    assert sglang.calls == [("start_profile", request), ("generate", None), ("stop_profile",)]
