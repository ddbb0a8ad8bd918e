"""SGLang server arguments built from train.py's argv, validated against ServerArgs' fields."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import types
from typing import Literal, Optional

import pytest

from trainer.arguments import UsageError, parse_args
from trainer.backends import registry
from trainer.backends.sglang import args as sglang_args
from trainer.backends.sglang import fields_table as sglang_fields_table
from trainer.backends.sglang.args import FieldType, SGLangArgError, parse_annotation
from trainer.backends.sglang.server_fields import SGLANG_VERSION

FIELDS, SOURCE = sglang_args.static_fields()

# The SGLang block of the AMD Qwen3-4B launcher (DESIGN.md section 2), colocated on 8 GPUs.
AMD_ARGV = [
    "--hf-checkpoint", "/models/Qwen3-4B", "--prompt-data", "/data/dapo-math-17k.jsonl",
    "--lora-rank", "64", "--lora-alpha", "32", "--target-modules", "all-linear",
    "--lora-base-cpu-backup", "--train-backend", "megatron", "--rollout-backend", "sglang",
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "8",
    "--colocate", "--rollout-num-gpus-per-engine", "1", "--sglang-mem-fraction-static", "0.4",
    "--sglang-chunked-prefill-size", "4096", "--sglang-lora-backend", "triton",
    "--sglang-attention-backend", "triton", "--rollout-batch-size", "8",
    "--n-samples-per-prompt", "8", "--global-batch-size", "64",
]  # fmt: skip


def _build(*extra: str, base: list[str] = AMD_ARGV) -> dict:
    config = parse_args([*base, *extra])
    targets = registry.adapter_targets(config)
    return sglang_args.build_server_args(config, targets, fields=FIELDS, source=SOURCE)


def test_amd_launcher_argv_builds_the_expected_server_args() -> None:
    assert _build() == {
        "model_path": "/models/Qwen3-4B",
        "tp_size": 1,
        "base_gpu_id": 0,
        "random_seed": 1234,
        "dtype": "bfloat16",
        "enable_lora": True,
        "max_lora_rank": 64,
        "lora_target_modules": [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
        ],
        "mem_fraction_static": 0.4,
        "chunked_prefill_size": 4096,
        "lora_backend": "triton",
        "attention_backend": "triton",
        "enable_memory_saver": True,
        "enable_weights_cpu_backup": True,
        "max_loras_per_batch": 2,
        "sampling_defaults": "openai",
    }  # fmt: skip


def test_colocated_with_memory_kept_the_engine_runs_without_the_memory_saver() -> None:
    base = [a for a in AMD_ARGV if a != "--lora-base-cpu-backup"]
    assert _build(base=base)["enable_memory_saver"] is True
    kept = _build("--colocate-memory", "keep", base=base)
    assert "enable_memory_saver" not in kept and "enable_weights_cpu_backup" not in kept


def test_serving_merged_weights_the_engine_runs_without_lora() -> None:
    torch = ("--train-backend", "torch")  # merged serving trains with the PEFT trainer
    merged = _build(*torch, "--lora-serving", "merged")
    lora = {"enable_lora", "max_lora_rank", "lora_target_modules", "max_loras_per_batch"}
    assert not (lora | {"lora_backend"}) & merged.keys()
    assert merged == {k: v for k, v in _build(*torch).items() if k not in lora | {"lora_backend"}}


def test_engine_seeds_differ_and_stay_within_32_bits() -> None:
    """SGLang seeds numpy with its random seed, which refuses 2**32 and above."""
    config = parse_args([*AMD_ARGV, "--seed", str(2**32 - 1)])
    targets = registry.adapter_targets(config)
    seeds = [
        sglang_args.build_server_args(
            config, targets, engine_index=index, fields=FIELDS, source=SOURCE
        )["random_seed"]
        for index in range(8)
    ]
    assert seeds == [2**32 - 1, *range(7)]


def test_extra_flags_map_onto_server_args_fields_with_their_types() -> None:
    kwargs = _build(
        "--sglang-disable-cuda-graph",
        "--sglang-max-running-requests", "64",
        "--sglang-cuda-graph-bs-decode", "1", "2", "4",
        "--sglang-context-length=none",
        "--sglang-schedule-conservativeness", "0.5",
        "--sglang-deepep-mode", "low_latency",
        "--sglang-log-level", "warning",
    )  # fmt: skip
    assert kwargs["disable_cuda_graph"] is True
    assert kwargs["max_running_requests"] == 64
    assert kwargs["cuda_graph_bs_decode"] == [1, 2, 4]
    assert kwargs["context_length"] is None
    assert kwargs["schedule_conservativeness"] == 0.5
    assert kwargs["deepep_mode"] == "low_latency"
    assert kwargs["log_level"] == "warning"


def test_unknown_flag_is_rejected_with_close_names() -> None:
    """train.py's own validation rejects it, before any backend starts."""
    with pytest.raises(UsageError) as err:
        _build("--sglang-max-runing-requests", "8")
    message = str(err.value)
    assert message.startswith("--sglang-max-runing-requests: unknown SGLang server argument")
    assert "did you mean --sglang-max-running-requests" in message
    assert f"SGLang {SGLANG_VERSION} table" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--sglang-tp-size", "2", "set by --rollout-num-gpus-per-engine"),
        ("--sglang-mem_fraction_static", "0.5", "set by --sglang-mem-fraction-static"),
        ("--sglang-max-running-requests", "lots", "expected an integer, got 'lots'"),
        ("--sglang-disable-radix-cache", "maybe", "expected true or false"),
        ("--sglang-deepep-mode", "fast", "expected one of auto, normal, low_latency"),
        ("--sglang-extra-metric-labels", "{bad", "expected JSON"),
        ("--sglang-custom-sigquit-handler", "x", "cannot be set from the command line"),
    ],
)
def test_bad_extra_values(flag: str, value: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _build(flag, value)


def test_a_kv_cache_cap_must_hold_more_than_a_response() -> None:
    with pytest.raises(UsageError, match=r"--sglang-max-total-tokens 256 caps SGLang's KV cache"):
        _build("--sglang-max-total-tokens", "256", "--rollout-max-response-len", "256")
    capped = _build("--sglang-max-total-tokens", "4096", "--rollout-max-response-len", "256")
    assert capped["max_total_tokens"] == 4096


def test_a_kv_cache_format_must_be_one_of_sglang_s() -> None:
    with pytest.raises(UsageError, match=r"--sglang-kv-cache-dtype fp9: not a KV-cache format"):
        _build("--sglang-kv-cache-dtype", "fp9")
    assert _build("--sglang-kv-cache-dtype", "fp8_e4m3")["kv_cache_dtype"] == "fp8_e4m3"


def test_colocate_without_backup_does_not_keep_a_weights_copy() -> None:
    base = [a for a in AMD_ARGV if a != "--lora-base-cpu-backup"]
    kwargs = _build(base=base)
    assert kwargs["enable_memory_saver"] is True
    assert "enable_weights_cpu_backup" not in kwargs


def test_lora_targets_follow_the_training_backend() -> None:
    megatron = _build("--target-modules", "q_proj,v_proj")
    assert megatron["lora_target_modules"] == ["q_proj", "k_proj", "v_proj"]
    torch_base = [a if a != "megatron" else "torch" for a in AMD_ARGV]
    peft = _build(
        "--target-modules", "q_proj,v_proj", "--exclude-modules", "v_proj", base=torch_base
    )
    assert peft["lora_target_modules"] == ["q_proj"]


def test_a_field_missing_from_the_installed_sglang_is_named() -> None:
    fields = {k: v for k, v in FIELDS.items() if k != "enable_weights_cpu_backup"}
    config = parse_args(AMD_ARGV)
    targets = registry.adapter_targets(config)
    with pytest.raises(SGLangArgError, match="no server argument enable_weights_cpu_backup"):
        sglang_args.build_server_args(
            config, targets, fields=fields, source="installed SGLang 0.5.2"
        )


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("int", FieldType("int")),
        ("Optional[float]", FieldType("float", nullable=True)),
        ("Optional[List[int]]", FieldType("list", element="int", nullable=True)),
        ("Literal['a', 'b']", FieldType("str", choices=("a", "b"))),
        ("Literal[None, 'm']", FieldType("str", nullable=True, choices=("m",))),
        ("Optional[Dict[str, Any]]", FieldType("json", nullable=True)),
        ("Optional[Union[str, Dict]]", FieldType("str", nullable=True, accepts_json=True)),
        ("Optional[Union[int]]", FieldType("int", nullable=True)),
        ("int | None", FieldType("int", nullable=True)),
        ("Optional[Callable]", FieldType("unsupported", nullable=True)),
    ],
)
def test_parse_annotation(annotation: str, expected: FieldType) -> None:
    assert parse_annotation(annotation) == expected


def test_structured_union_value_is_read_as_json() -> None:
    field = parse_annotation("Optional[Union[str, Dict[str, int]]]")
    assert sglang_args.coerce("--sglang-x", '{"a": 1}', field) == {"a": 1}
    assert sglang_args.coerce("--sglang-x", "plain", field) == "plain"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed")
def test_without_sglang_the_static_table_is_used() -> None:
    fields, source = sglang_args.server_fields()
    assert fields == FIELDS
    assert f"{SGLANG_VERSION} table" in source


def test_installed_serverargs_is_read_from_its_dataclass_fields(monkeypatch) -> None:
    # Real typing objects, not strings: what a ServerArgs without postponed annotations holds.
    server_args = dataclasses.make_dataclass(
        "ServerArgs",
        [
            ("model_path", str),
            ("tp_size", int, 1),
            ("new_knob", Optional[int], None),  # noqa: UP045
            ("mode", Literal["x", "y"], "x"),
        ],
    )
    assert not isinstance(dataclasses.fields(server_args)[2].type, str)

    module = types.ModuleType("sglang.srt.server_args")
    module.ServerArgs = server_args
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", module)
    monkeypatch.setattr("importlib.metadata.version", lambda name: "9.9.9")
    fields, source = sglang_args.installed_fields()
    assert source == "installed SGLang 9.9.9"
    assert fields["new_knob"] == FieldType("int", nullable=True)
    assert fields["mode"] == FieldType("str", choices=("x", "y"))
    assert sglang_args.coerce_extra({"new-knob": "3"}, fields, source) == {"new_knob": 3}


def test_every_recorded_sglang_launcher_yields_valid_server_args() -> None:
    from harness.discovery import discover_launchers
    from harness.record import record
    from harness.steps import train_py_argv

    built = {}
    for launcher in discover_launchers():
        for name in launcher.recordings:
            for step in record(launcher, name).steps:
                argv = train_py_argv(step)
                config = None if argv is None else parse_args(argv)
                if config is None or config.placement.rollout_backend != "sglang":
                    continue
                kwargs = sglang_args.build_server_args(
                    config, registry.adapter_targets(config), fields=FIELDS, source=SOURCE
                )
                built[launcher.recorded_hardware] = (
                    kwargs["attention_backend"],
                    kwargs["lora_backend"],
                )
    assert built["MI355X"] == ("triton", "triton")
    assert set(built) >= {"MI355X", "H200"}


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)


# ServerArgs as SGLang releases declared it, written as modules so that postponed annotations
# are resolved (or not) the way Python resolves SGLang's own.
ANNOTATED_DATACLASS = """
from __future__ import annotations

import dataclasses
from typing import Annotated as A, List, Literal, Optional


class Arg:
    def __init__(self, help: str = "", **metadata: object) -> None:
        self.help = help


def NS(name: str) -> str:
    return name


@dataclasses.dataclass
class ServerArgs:  # SGLang 0.5.17
    model_path: A[str, Arg(help="weights", aliases=["--model"]), NS("model")]
    tp_size: A[int, "tensor parallel size", NS("parallel")] = 1
    cuda_graph_bs_decode: A[Optional[List[int]], "batch sizes"] = None
    deepep_mode: A[Literal["auto", "normal", "low_latency"], Arg(help="mode")] = "auto"
"""

STRUCT_FIELDS = """
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated as A, List, Optional, Union

import msgspec

if TYPE_CHECKING:
    from elsewhere import LoRARef


class Lora(msgspec.Struct):
    enable_lora: A[Optional[bool], "enable LoRA"] = None
    max_lora_rank: A[Optional[int], "rank"] = None
    max_loaded_loras: A[Optional[int], "resident adapters"] = None
    lora_paths: A[Optional[Union[dict[str, str], List[str], List[LoRARef]]], "adapters"] = None
"""

STRUCT_SERVER_ARGS = """
from __future__ import annotations

import msgspec

from {fields} import Lora

ServerArgs = msgspec.defstruct(  # SGLang 0.5.23
    "ServerArgs",
    [(name, Lora.__annotations__[name], None) for name in Lora.__struct_fields__],
    module=__name__,
)
"""


def _module(tmp_path, monkeypatch, name: str, source: str) -> types.ModuleType:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


def test_annotated_fields_under_postponed_annotations_are_read(tmp_path, monkeypatch) -> None:
    """SGLang 0.5.17: ``A[T, help, NS(...)]`` strings; reading them as text refused them all."""
    module = _module(tmp_path, monkeypatch, "sgl_annotated_args", ANNOTATED_DATACLASS)
    fields = sglang_args.declared_fields(module.ServerArgs)
    assert fields == {
        "model_path": FieldType("str"),
        "tp_size": FieldType("int"),
        "cuda_graph_bs_decode": FieldType("list", element="int", nullable=True),
        "deepep_mode": FieldType("str", choices=("auto", "normal", "low_latency")),
    }
    assert sglang_args.coerce_extra({"cuda-graph-bs-decode": "1 2 4"}, fields) == {
        "cuda_graph_bs_decode": [1, 2, 4]
    }


def test_msgspec_struct_fields_are_read(tmp_path, monkeypatch) -> None:
    """SGLang 0.5.23: a msgspec Struct (``dataclasses.fields`` raises on it), whose annotations
    name a type imported only for type checking (read as text; ``A`` is SGLang's Annotated)."""
    pytest.importorskip("msgspec")
    _module(tmp_path, monkeypatch, "sgl_struct_fields", STRUCT_FIELDS)
    source = STRUCT_SERVER_ARGS.format(fields="sgl_struct_fields")
    module = _module(tmp_path, monkeypatch, "sgl_struct_args", source)
    fields = sglang_args.declared_fields(module.ServerArgs)
    assert fields["enable_lora"] == FieldType("bool", nullable=True)
    assert fields["max_lora_rank"] == FieldType("int", nullable=True)
    assert fields["lora_paths"] == FieldType("list", nullable=True, accepts_json=True)
    assert sglang_args.coerce_extra({"max-loaded-loras": "4"}, fields) == {"max_loaded_loras": 4}


def test_annotated_text_reads_as_its_first_item() -> None:
    assert parse_annotation("A[Optional[int], 'help', NS('x')]", frozenset({"A"})) == FieldType(
        "int", nullable=True
    )
    assert parse_annotation("Annotated[bool, Arg(help='x')]") == FieldType("bool")


def test_offline_table_generator_drops_annotated_metadata() -> None:
    source = ANNOTATED_DATACLASS + "\n\ndef helper() -> None: ...\n"
    assert sglang_fields_table.server_args_fields(source) == {
        "model_path": "str",
        "tp_size": "int",
        "cuda_graph_bs_decode": "Optional[List[int]]",
        "deepep_mode": "Literal['auto', 'normal', 'low_latency']",
    }


def test_offline_table_is_the_pinned_sglang() -> None:
    """The table follows the SGLang version the sglang extra pins."""
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[4] / "pyproject.toml").read_text())
    (requirement,) = pyproject["project"]["optional-dependencies"]["sglang"]
    assert requirement == f"sglang=={SGLANG_VERSION}"
