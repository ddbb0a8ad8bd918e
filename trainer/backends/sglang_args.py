"""SGLang server arguments (``sglang.Engine(**kwargs)``) built from ``train.py``'s argv.

The declared flags map onto ServerArgs fields directly (``--rollout-num-gpus-per-engine`` ->
``tp_size``, ``--sglang-mem-fraction-static`` -> ``mem_fraction_static``, ...); every other
``--sglang-<name> VALUE`` collected in ``args.sglang_extra`` becomes ServerArgs field
``<name>`` (dashes -> underscores), its string value coerced to the field's annotated type. An
unknown name is rejected in one line that lists the closest valid names.

Field names and types come from the installed ``sglang.srt.server_args.ServerArgs`` when SGLang
is importable, else from the static table of SGLang 0.5.9 (`sglang_server_fields`). Pure: only
SGLang's dataclass is read, never an engine started.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainer.backends import megatron_lora_names
from trainer.backends.sglang_server_fields import SERVER_ARGS_FIELDS, SGLANG_VERSION

FLAG_PREFIX = "--sglang-"
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})
_NULL = frozenset({"none", "null"})
_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp32": "float32"}

# ServerArgs fields this trainer sets from its own flags; an --sglang-* override is refused.
MANAGED_FIELDS: dict[str, str] = {
    "model_path": "--hf-checkpoint",
    "tp_size": "--rollout-num-gpus-per-engine",
    "mem_fraction_static": "--sglang-mem-fraction-static",
    "chunked_prefill_size": "--sglang-chunked-prefill-size",
    "lora_backend": "--sglang-lora-backend",
    "attention_backend": "--sglang-attention-backend",
    "enable_lora": "--lora-rank",
    "max_lora_rank": "--lora-rank",
    "lora_target_modules": "--target-modules / --exclude-modules",
    "random_seed": "--seed",
    "dtype": "--dtype",
    "base_gpu_id": "the job's GPU placement",
    "enable_memory_saver": "--colocate",
    "enable_weights_cpu_backup": "--lora-base-cpu-backup",
}


class SGLangArgError(ValueError):
    """A ``--sglang-*`` flag SGLang does not accept (one-line message)."""


@dataclass(frozen=True)
class FieldType:
    """How to read a flag value for one ServerArgs field."""

    kind: str  # bool | int | float | str | list | json | unsupported (| none inside a union)
    element: str = "str"  # element kind of a list
    nullable: bool = False
    choices: tuple[str, ...] = ()
    accepts_json: bool = False  # a union with structured members: ``{...}`` / ``[...]`` is JSON


_SCALARS = {"bool", "int", "float", "str"}
_LISTS = {"List", "list", "Set", "set", "Tuple", "tuple", "Sequence"}
_MAPS = {"Dict", "dict", "Mapping", "Any"}


def parse_annotation(text: str) -> FieldType:
    """Read a ServerArgs annotation such as ``Optional[List[int]]`` or ``Literal['a', 'b']``."""
    return _field_type(ast.parse(text, mode="eval").body)


def _subscript_items(node: ast.Subscript) -> list[ast.expr]:
    inner = node.slice
    return list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    return [node]


def _field_type(node: ast.expr) -> FieldType:
    if isinstance(node, ast.BinOp):
        return _union(_union_members(node))
    if isinstance(node, ast.Constant) and node.value is None:
        return FieldType("none", nullable=True)
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name in _SCALARS:
            return FieldType(name)
        return FieldType("json") if name in _MAPS else FieldType("unsupported")
    if not isinstance(node, ast.Subscript):
        return FieldType("unsupported")
    head = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
    items = _subscript_items(node)
    if head == "Optional":
        return dataclasses.replace(_field_type(items[0]), nullable=True)
    if head == "Literal":
        values = [item.value for item in items if isinstance(item, ast.Constant)]
        return FieldType(
            "str", nullable=None in values, choices=tuple(str(v) for v in values if v is not None)
        )
    if head in _LISTS:
        element = _field_type(items[0])
        return FieldType("list", element=element.kind if element.kind in _SCALARS else "json")
    if head in _MAPS:
        return FieldType("json")
    if head == "Union":
        return _union(items)
    return FieldType("unsupported")


def _union(items: list[ast.expr]) -> FieldType:
    members = [_field_type(item) for item in items]
    nullable = any(m.nullable for m in members)
    usable = [m for m in members if m.kind not in ("unsupported", "none")]
    if len(usable) == 1:
        return dataclasses.replace(usable[0], nullable=nullable)
    lists = [m for m in usable if m.kind == "list" and m.element in _SCALARS]
    first = lists[0] if lists else next((m for m in usable if m.kind in _SCALARS), None)
    if first is None:
        return FieldType("json", nullable=nullable)
    structured = any(m.kind in ("json", "list") for m in usable if m is not first)
    return dataclasses.replace(first, nullable=nullable, accepts_json=structured)


def _annotation_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def static_fields() -> tuple[dict[str, FieldType], str]:
    """Field types from the SGLang 0.5.9 table."""
    table = {name: parse_annotation(text) for name, text in SERVER_ARGS_FIELDS.items()}
    return table, f"SGLang {SGLANG_VERSION} table; SGLang is not installed here"


def installed_fields() -> tuple[dict[str, FieldType], str]:
    """Field types of the installed ``sglang.srt.server_args.ServerArgs`` (imports SGLang)."""
    from importlib.metadata import version

    from sglang.srt.server_args import ServerArgs

    fields = dataclasses.fields(ServerArgs)
    return (
        {f.name: parse_annotation(_annotation_text(f.type)) for f in fields},
        f"installed SGLang {version('sglang')}",
    )


def server_fields() -> tuple[dict[str, FieldType], str]:
    """The installed SGLang's fields when it is importable, else the static table."""
    if importlib.util.find_spec("sglang") is not None:
        return installed_fields()
    return static_fields()


def coerce(flag: str, raw: str, field: FieldType) -> Any:
    """The Python value of ``flag raw`` for a field of type `field`."""
    text = raw.strip()
    if field.nullable and text.lower() in _NULL:
        return None
    if field.kind == "unsupported":
        raise SGLangArgError(
            f"{flag}: this SGLang server argument cannot be set from the command line"
        )
    structured = field.kind == "list" or field.accepts_json
    if field.kind == "json" or (structured and text[:1] in ("[", "{")):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise SGLangArgError(f"{flag}: expected JSON ({err.msg})") from None
    if field.kind == "list":
        parts = [p for p in text.replace(",", " ").split() if p]
        return [coerce(flag, p, FieldType(field.element)) for p in parts]
    if field.kind == "bool":
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise SGLangArgError(f"{flag}: expected true or false, got {raw!r}")
    if field.kind in ("int", "float"):
        try:
            return int(text) if field.kind == "int" else float(text)
        except ValueError:
            noun = "an integer" if field.kind == "int" else "a number"
            raise SGLangArgError(f"{flag}: expected {noun}, got {raw!r}") from None
    if field.choices and text not in field.choices:
        raise SGLangArgError(f"{flag}: expected one of {', '.join(field.choices)}, got {raw!r}")
    return raw


def coerce_extra(
    extra: Mapping[str, str], fields: Mapping[str, FieldType] | None = None, source: str = ""
) -> dict[str, Any]:
    """``args.sglang_extra`` (flag name without ``--sglang-`` -> value) -> ServerArgs kwargs."""
    if fields is None:
        fields, source = server_fields()
    out: dict[str, Any] = {}
    for key, raw in extra.items():
        name = key.removeprefix("--").removeprefix("sglang-").replace("-", "_")
        flag = FLAG_PREFIX + name.replace("_", "-")
        if name in MANAGED_FIELDS:
            raise SGLangArgError(f"{flag}: set by {MANAGED_FIELDS[name]}, not as an extra flag")
        if name not in fields:
            close = difflib.get_close_matches(name, list(fields), n=3, cutoff=0.6)
            hint = (
                f"; did you mean {', '.join(FLAG_PREFIX + c.replace('_', '-') for c in close)}?"
                if close
                else ""
            )
            where = f" ({source})" if source else ""
            raise SGLangArgError(f"{flag}: unknown SGLang server argument{where}{hint}")
        out[name] = coerce(flag, raw, fields[name])
    return out


def lora_target_modules(args: argparse.Namespace) -> list[str]:
    """HF projection names the engine reserves LoRA buffers for.

    Megatron fuses q/k/v and gate/up, so its adapters cover whole groups; a PEFT trainer adapts
    exactly the listed projections (``all-linear`` = the seven projections of a decoder layer).
    """
    if args.train_backend == "megatron":
        return list(
            megatron_lora_names.resolve_targets(args.target_modules, args.exclude_modules).hf
        )
    requested = [m.strip() for m in args.target_modules.split(",") if m.strip()]
    modules = (
        list(megatron_lora_names.HF_MODULES)
        if any(m in megatron_lora_names.ALL_LINEAR_ALIASES for m in requested)
        else requested
    )
    excluded = {m.strip() for m in (args.exclude_modules or "").split(",") if m.strip()}
    return [m for m in modules if m not in excluded]


def build_server_args(
    args: argparse.Namespace,
    *,
    base_gpu_id: int = 0,
    fields: Mapping[str, FieldType] | None = None,
    source: str = "",
) -> dict[str, Any]:
    """ServerArgs kwargs for one rollout engine of ``--rollout-num-gpus-per-engine`` GPUs."""
    if fields is None:
        fields, source = server_fields()
    kwargs: dict[str, Any] = {
        "model_path": args.hf_checkpoint,
        "tp_size": args.rollout_num_gpus_per_engine,
        "base_gpu_id": base_gpu_id,
        "random_seed": args.seed,
        "dtype": _DTYPES[args.dtype],
        "enable_lora": True,
        "max_lora_rank": args.lora_rank,
        "lora_target_modules": lora_target_modules(args),
    }
    optional = {
        "mem_fraction_static": args.sglang_mem_fraction_static,
        "chunked_prefill_size": args.sglang_chunked_prefill_size,
        "lora_backend": args.sglang_lora_backend,
        "attention_backend": args.sglang_attention_backend,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if args.colocate:
        kwargs["enable_memory_saver"] = True
        if args.lora_base_cpu_backup:
            kwargs["enable_weights_cpu_backup"] = True
    missing = [name for name in kwargs if name not in fields]
    if missing:
        raise SGLangArgError(
            f"{source or 'SGLang'} has no server argument {', '.join(missing)} "
            f"(needed by {', '.join(MANAGED_FIELDS[m] for m in missing)})"
        )
    kwargs.update(coerce_extra(args.sglang_extra, fields, source))
    return kwargs
