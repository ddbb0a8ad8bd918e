"""The capability check: what the backends need of this Python's packages (an import, an
attribute, its signature), one line each before Ray starts, and one line naming the first one
missing with the recipe's pin of its package.

SGLang is not installed here: a stand-in ``sglang`` package (with its own dist-info, so that
it has a version) is put on ``sys.path``, once as an old release without the flattened-bucket
adapter loading and once with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.trainer.test_loop import recipe_argv, tiny_dirs  # noqa: F401  (fixture)
from trainer.arguments import parse_args
from trainer.backends import registry
from trainer.backends.capabilities import CATALOGUE, Capability, missing
from trainer.errors import UsageError
from trainer.job import capabilities
from trainer.job.main import main

ADAPTER = "sglang.Engine.load_lora_adapter_from_tensors"
BUCKET = "sglang.srt.weight_sync.tensor_bucket.FlattenedTensorMetadata"
OLD_ENGINE = """
class Engine:
    def load_lora_adapter_from_tensors(self, lora_name, tensors, config_dict):
        pass
"""
NEW_ENGINE = """
class Engine:
    def load_lora_adapter_from_tensors(self, lora_name, tensors, config_dict, load_format=None):
        pass
"""
BUCKET_MODULE = """
from dataclasses import dataclass

@dataclass
class FlattenedTensorMetadata:
    name: str
    shape: tuple
    dtype: str
    start_idx: int
    end_idx: int
    numel: int
"""


def stand_in_sglang(root: Path, version: str, engine: str) -> Path:
    """A package ``sglang`` of `version` under `root` whose ``Engine`` is `engine`'s."""
    package = root / "sglang"
    (package / "srt" / "weight_sync").mkdir(parents=True)
    (package / "__init__.py").write_text(engine)
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "weight_sync" / "__init__.py").write_text("")
    (package / "srt" / "weight_sync" / "tensor_bucket.py").write_text(BUCKET_MODULE)
    info = root / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return root


@pytest.fixture
def on_path(monkeypatch: pytest.MonkeyPatch):
    """Put a folder first on ``sys.path``; its ``sglang`` modules are forgotten afterwards."""

    def put(folder: Path) -> None:
        monkeypatch.syspath_prepend(str(folder))

    yield put
    for name in [name for name in sys.modules if name.split(".")[0] == "sglang"]:
        del sys.modules[name]


def sglang_argv(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    """The tiny recipe's argv with SGLang rollout (GPUs: no ``--device cpu``)."""
    argv = recipe_argv(model, data, out, "--rollout-backend", "sglang", *extra)
    device = argv.index("--device")
    return argv[:device] + argv[device + 2 :]


def test_train_py_refuses_an_sglang_without_the_bucket_api_in_one_line_before_ray(
    tiny_dirs,  # noqa: F811
    tmp_path,
    on_path,
    monkeypatch,
    capsys,
) -> None:
    import ray

    def started(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr(ray, "init", started)
    on_path(stand_in_sglang(tmp_path / "site", "0.5.9", OLD_ENGINE))
    model, data = tiny_dirs
    argv = sglang_argv(
        model, data, tmp_path / "out",
        "--require-capability", ADAPTER, BUCKET, "--constraints", "constraints/cuda-sglang.txt",
    )  # fmt: skip

    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"train.py: error: capability {ADAPTER}: missing (sglang 0.5.9: {ADAPTER} takes no "
        "load_format); install the recipe's pin, sglang==0.5.17 (constraints/cuda-sglang.txt)\n"
    )
    assert "capability peft.LoraConfig: ok (peft " in out  # the trainer's own need came first
    assert not (tmp_path / "out").exists()


def test_an_sglang_with_it_passes_with_one_line_per_capability(
    tiny_dirs,  # noqa: F811
    tmp_path,
    on_path,
) -> None:
    on_path(stand_in_sglang(tmp_path / "site", "0.5.17", NEW_ENGINE))
    model, data = tiny_dirs
    config = parse_args(
        sglang_argv(model, data, tmp_path / "out", "--require-capability", ADAPTER, BUCKET)
    )
    lines: list[str] = []
    capabilities.check(config, emit=lines.append)
    assert lines == [
        f"capability peft.LoraConfig: ok (peft {capabilities.installed_version('peft')})",
        f"capability {ADAPTER}: ok (sglang 0.5.17)",
        f"capability {BUCKET}: ok (sglang 0.5.17)",
    ]


def test_the_cpu_job_checks_its_backends_own_needs(tiny_dirs, tmp_path) -> None:  # noqa: F811
    model, data = tiny_dirs
    lines: list[str] = []
    capabilities.check(parse_args(recipe_argv(model, data, tmp_path)), emit=lines.append)
    peft = capabilities.installed_version("peft")
    assert lines == [
        f"capability peft.LoraConfig: ok (peft {peft})",
        f"capability peft.get_peft_model: ok (peft {peft})",
    ]


def test_a_need_of_a_backend_not_selected_is_skipped(tiny_dirs, tmp_path) -> None:  # noqa: F811
    """The recipe needs SGLang's API; a run of it with --rollout-backend hf does not."""
    model, data = tiny_dirs
    config = parse_args(recipe_argv(model, data, tmp_path, "--require-capability", ADAPTER))
    assert [c.name for c in capabilities.needed(config)] == [
        "peft.LoraConfig",
        "peft.get_peft_model",
    ]


@pytest.mark.parametrize(
    ("capability", "reason"),
    [
        (Capability("no_such_module_here"), "cannot import no_such_module_here (No module named"),
        (Capability("json", "no_such_thing"), "json has no no_such_thing"),
        (Capability("json", "dumps", ("obj", "no_such_parameter")), "json.dumps takes no no_such"),
        (Capability("sys", "flags.no_such_flag"), "sys.flags has no no_such_flag"),
        (Capability("sys", "float_info.dig", truthy=False), None),
        (Capability("torch", "version.hip", truthy=True), "torch.version.hip is None"),
    ],
)
def test_missing_says_what_is_missing(capability: Capability, reason: str | None) -> None:
    found = missing(capability)
    assert found is None if reason is None else (found or "").startswith(reason), found


def test_a_missing_build_names_the_pin_or_says_there_is_none() -> None:
    def refusal(*constraints: str) -> str:
        argv = ["--hf-checkpoint", "/m", "--prompt-data", "/d"]
        argv += ["--require-capability", "torch.version.hip"]
        config = parse_args([*argv, "--constraints", *constraints] if constraints else argv)
        with pytest.raises(UsageError) as err:
            capabilities.check(config, emit=lambda line: None)
        return str(err.value)

    assert refusal("constraints/cuda-sglang.txt").endswith(
        "; install the recipe's pin, torch==2.11.0 (constraints/cuda-sglang.txt)"
    )
    assert refusal().endswith("; install a torch that has it")
    assert refusal("constraints/rocm.txt").endswith(
        "; no pin of torch in constraints/rocm.txt: install one that has it"
    )


def test_an_unknown_capability_or_a_constraints_path_outside_the_checkout_is_refused() -> None:
    base = ["--hf-checkpoint", "/m", "--prompt-data", "/d"]
    with pytest.raises(UsageError, match="--require-capability: invalid choice"):
        parse_args([*base, "--require-capability", "sglang.Engine.no_such_api"])
    with pytest.raises(UsageError, match="give a path inside the checkout"):
        parse_args([*base, "--constraints", "/etc/passwd"])
    config = parse_args([*base, "--constraints", "constraints/no-such.txt"])
    with pytest.raises(UsageError, match=r"--constraints constraints/no-such\.txt: No such file"):
        capabilities.check(config, emit=lambda line: None)


def test_every_backends_need_is_in_the_catalogue_under_its_backend() -> None:
    for spec in (*registry.TRAIN_BACKENDS.values(), *registry.ROLLOUT_BACKENDS.values()):
        for name in spec.capabilities:
            assert CATALOGUE[name].backend in (spec.name, None), name


def test_pins_are_the_exact_versions_of_a_constraints_file_by_normalized_name(tmp_path) -> None:
    (tmp_path / "c.txt").write_text(
        "# a comment naming torch==9.9\n"
        "--index-url https://example.org/simple\n"
        "Transformer_Engine[core_cu13]==2.20.2 ; python_version >= '3.10'  # the core\n"
        "sglang>=0.5\n"
        "torch==2.11.0\n"
    )
    (tmp_path / "d.txt").write_text("torch==2.13.0\n")
    assert capabilities.pins(["c.txt", "d.txt"], root=tmp_path) == {
        "transformer-engine": "Transformer_Engine==2.20.2 (c.txt)",
        "torch": "torch==2.11.0 (c.txt)",  # the first file pinning it wins
    }
