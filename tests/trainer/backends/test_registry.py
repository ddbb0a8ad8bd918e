"""Backend names -> lazily imported factories; any trainer pairs with any rollout engine."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import subprocess
import sys
import types

import pytest

from trainer.backends import registry


def test_the_argv_accepts_the_registry_names() -> None:
    from trainer.arguments import build_parser

    choices = {a.dest: set(a.choices) for a in build_parser()._actions if a.choices}
    assert set(registry.TRAIN_BACKENDS) == choices["train_backend"] == {"megatron", "torch"}
    assert set(registry.ROLLOUT_BACKENDS) == choices["rollout_backend"] == {"sglang", "hf"}


def config_of(*argv: str):
    from trainer.arguments import parse_args

    return parse_args(["--hf-checkpoint", "/m", "--prompt-data", "/d", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--tensor-model-parallel-size", "2", "--actor-num-gpus-per-node", "2"],
            "--tensor-model-parallel-size 2 needs --train-backend megatron",
        ),
        (
            ["--sglang-attention-backend", "triton"],
            "--sglang-attention-backend needs --rollout-backend sglang",
        ),
        (
            ["--device", "cpu", "--rollout-backend", "sglang"],
            "--device cpu works only with --train-backend torch and --rollout-backend hf",
        ),
    ],
)
def test_the_argv_checks_come_from_the_registry(monkeypatch, argv, message) -> None:
    """A backend's flag group and its GPU need are the registry's: an unselected backend's
    flags are refused, and a CPU run refuses the backends the registry marks GPU-only."""
    from trainer.errors import UsageError

    with pytest.raises(UsageError, match=message):
        config_of(*argv)
    # without the flag group, or the GPU need, in the registry the same argv passes
    for table in (registry.TRAIN_BACKENDS, registry.ROLLOUT_BACKENDS):
        for name, spec in list(table.items()):
            monkeypatch.setitem(table, name, dataclasses.replace(spec, flags=None, needs_gpu=False))
    config_of(*argv)


def test_the_adapter_targets_follow_the_trainer() -> None:
    """A trainer that fuses projections (Megatron) widens q_proj to q/k/v; PEFT does not."""
    fused = config_of("--train-backend", "megatron", "--target-modules", "q_proj")
    assert registry.adapter_targets(fused).hf == ("q_proj", "k_proj", "v_proj")
    assert registry.adapter_targets(config_of("--target-modules", "q_proj")).hf == ("q_proj",)


SPECS = [*registry.TRAIN_BACKENDS.values(), *registry.ROLLOUT_BACKENDS.values()]


@pytest.mark.parametrize("spec", SPECS, ids=[spec.module for spec in SPECS])
def test_backend_modules_expose_the_factory_without_importing_heavy_packages(spec) -> None:
    factory = importlib.import_module(spec.module).create
    params = list(inspect.signature(factory).parameters.values())
    assert [p.name for p in params[:2]] == ["config", "device"]
    keyword = "total_steps" if spec in registry.TRAIN_BACKENDS.values() else "engine_index"
    assert [p.name for p in params[2:]] == [keyword]
    assert params[2].kind is inspect.Parameter.KEYWORD_ONLY
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)


def test_a_new_rollout_backend_is_its_module_and_its_registry_entry(monkeypatch) -> None:
    """From the entry alone: a choice of the flag, cuda for --device auto when it needs GPUs,
    refused with --device cpu, checked by the preflight, and created through its factory."""
    from trainer.errors import UsageError
    from trainer.job import preflight

    fake = types.ModuleType("fake_rollout")
    fake.create = lambda config, device, *, engine_index: ("engine", device, engine_index)
    monkeypatch.setitem(sys.modules, "fake_rollout", fake)
    spec = registry.BackendSpec("fake", "Fake", "fake_rollout", ("fake-dist",), needs_gpu=True)
    monkeypatch.setitem(registry.ROLLOUT_BACKENDS, "fake", spec)
    config = config_of("--rollout-backend", "fake")
    assert config.placement.device == "cuda"
    assert registry.create_rollout(config, "cuda:1", engine_index=3) == ("engine", "cuda:1", 3)
    with pytest.raises(UsageError, match="--device cpu works only with"):
        config_of("--rollout-backend", "fake", "--device", "cpu")
    env = preflight.probe({})
    assert (
        "--rollout-backend fake needs fake-dist" in preflight.problems(config.placement, env, 1)[0]
    )


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
            monkeypatch.setitem(
                table, name, registry.BackendSpec(name, name, "fake_backend", packages=())
            )
    config = config_of("--train-backend", train, "--rollout-backend", rollout)
    registry.create_trainer(config, "cuda:3", total_steps=7)
    registry.create_rollout(config, "cuda:3")
    registry.create_rollout(config, "cuda:3", engine_index=2)
    assert calls == [
        ((config, "cuda:3"), {"total_steps": 7}),
        ((config, "cuda:3"), {"engine_index": 0}),
        ((config, "cuda:3"), {"engine_index": 2}),
    ]


def test_the_registry_imports_no_backend() -> None:
    """The registry names every backend without importing one: a factory or a check is imported
    by its dotted name when called. In a fresh interpreter, so no other test's imports count."""
    code = (
        "import sys\n"
        "from trainer.backends import registry\n"
        "packages = [f'trainer.backends.{name}' for name in ('megatron', 'sglang', 'torch')]\n"
        "print([m for m in sys.modules for p in packages if m == p or m.startswith(p + '.')])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
