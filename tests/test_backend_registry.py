"""Backend names -> lazily imported factories; any trainer pairs with any rollout engine."""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import types

import pytest

from trainer.backends import registry


def test_every_name_the_argv_accepts_has_a_backend() -> None:
    from trainer.arguments import build_parser

    choices = {a.dest: set(a.choices) for a in build_parser()._actions if a.choices}
    assert set(registry.TRAIN_BACKENDS) == choices["train_backend"]
    assert set(registry.ROLLOUT_BACKENDS) == choices["rollout_backend"]


@pytest.mark.parametrize(
    ("spec", "module"),
    [
        (registry.train_spec("megatron"), "trainer.backends.megatron_trainer"),
        (registry.train_spec("torch"), "trainer.backends.peft_trainer"),
        (registry.rollout_spec("sglang"), "trainer.backends.sglang_rollout"),
        (registry.rollout_spec("hf"), "trainer.backends.hf_rollout"),
    ],
)
def test_backend_modules_expose_the_factory_without_importing_heavy_packages(spec, module) -> None:
    assert spec.module == module
    factory = importlib.import_module(module).create
    params = list(inspect.signature(factory).parameters.values())
    assert [p.name for p in params[:2]] == ["args", "device"]
    keyword = "total_steps" if spec in registry.TRAIN_BACKENDS.values() else "engine_index"
    assert [p.name for p in params[2:]] == [keyword]
    assert params[2].kind is inspect.Parameter.KEYWORD_ONLY
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)


def test_production_backends_declare_their_packages() -> None:
    megatron = registry.train_spec("megatron")
    assert {"megatron-core", "megatron-bridge"} <= set(megatron.packages)
    assert megatron.modules == ("transformer_engine",) and megatron.needs_gpu
    assert registry.rollout_spec("sglang").packages == ("sglang",)
    assert not registry.train_spec("torch").needs_gpu


def test_unknown_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="--train-backend 'jax' is not one of megatron, torch"):
        registry.train_spec("jax")
    with pytest.raises(ValueError, match="--rollout-backend 'vllm' is not one of sglang, hf"):
        registry.rollout_spec("vllm")


@pytest.mark.parametrize("train", ["megatron", "torch"])
@pytest.mark.parametrize("rollout", ["sglang", "hf"])
def test_any_trainer_pairs_with_any_engine(monkeypatch, train: str, rollout: str) -> None:
    calls = []
    fake = types.ModuleType("fake_backend")
    fake.create = lambda *a, **kw: calls.append((a, kw)) or object()
    monkeypatch.setitem(sys.modules, "fake_backend", fake)
    for table in (registry.TRAIN_BACKENDS, registry.ROLLOUT_BACKENDS):
        for name in list(table):
            monkeypatch.setitem(table, name, registry.BackendSpec(name, "fake_backend", ()))
    args = argparse.Namespace(train_backend=train, rollout_backend=rollout)
    registry.create_trainer(args, "cuda:3", total_steps=7)
    registry.create_rollout(args, "cuda:3")
    registry.create_rollout(args, "cuda:3", engine_index=2)
    assert calls == [
        ((args, "cuda:3"), {"total_steps": 7}),
        ((args, "cuda:3"), {"engine_index": 0}),
        ((args, "cuda:3"), {"engine_index": 2}),
    ]


@pytest.mark.parametrize(("device", "index"), [("cuda", 0), ("cuda:5", 5), ("cpu", 0)])
def test_gpu_index(device: str, index: int) -> None:
    assert registry.gpu_index(device) == index


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
