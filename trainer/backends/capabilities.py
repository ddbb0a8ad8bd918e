"""What the backends need of the packages on the node, beyond their versions: capabilities.

A `Capability` names an importable module, an attribute in it (a class, a method, a value) and
the parameters its signature must take, or that the value must be set (``torch.version.hip``).
A version says little on a node whose image carries its own builds: an SGLang built from a
commit before its LoRA adapter endpoint reports a version all the same, and the run then dies
at its first weight update (miles PR #3156). `missing` imports the module and inspects the
attribute (`inspect.signature`); it never runs GPU work.

A backend of the registry names what it cannot run without (`BackendSpec.capabilities`); a
recipe names more with ``--require-capability`` (what its speed or its memory plan relies on,
such as SGLang's flattened-bucket adapter loading). A capability of a backend the run does not
select is not its need (`backend`). ``trainer.job.capabilities`` checks them before Ray starts.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from trainer.errors import first_line


@dataclass(frozen=True)
class Capability:
    """`module`'s `attribute` (dotted; empty: the module itself) exists, takes `parameters`
    and, with `truthy`, is set. `distribution` is the package that brings it (its version is
    shown, its pin named). `backend`: the ``--train-backend`` / ``--rollout-backend`` it is a
    need of (None: any run)."""

    module: str
    attribute: str = ""
    parameters: tuple[str, ...] = ()
    truthy: bool = False
    distribution: str = ""
    backend: str | None = None

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


def _catalogue(*capabilities: Capability) -> dict[str, Capability]:
    return {capability.name: capability for capability in capabilities}


CATALOGUE = _catalogue(
    # SGLang: an adapter from memory, as one flattened bucket (0.5.17: ``load_format``), and
    # the bucket's metadata class the scheduler's restricted unpickler accepts.
    Capability(
        "sglang",
        "Engine.load_lora_adapter_from_tensors",
        ("lora_name", "tensors", "config_dict", "load_format"),
        distribution="sglang",
        backend="sglang",
    ),
    Capability(
        "sglang.srt.weight_sync.tensor_bucket",
        "FlattenedTensorMetadata",
        ("name", "shape", "dtype", "start_idx", "end_idx", "numel"),
        distribution="sglang",
        backend="sglang",
    ),
    # Megatron-Bridge's PEFT LoRA with the settings the trainer gives it.
    Capability(
        "megatron.bridge.peft.lora",
        "LoRA",
        ("target_modules", "dim", "alpha", "dropout"),
        distribution="megatron-bridge",
        backend="megatron",
    ),
    # Transformer Engine's PyTorch side loads its compiled extension on import.
    Capability("transformer_engine.pytorch", distribution="transformer-engine", backend="megatron"),
    # PEFT: the trainer's LoRA config (exclude_modules: PEFT >= 0.14) and the rollout's model.
    Capability(
        "peft",
        "LoraConfig",
        ("r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "task_type"),
        distribution="peft",
        backend="torch",
    ),
    Capability(
        "peft",
        "get_peft_model",
        ("model", "peft_config", "autocast_adapter_dtype"),
        distribution="peft",
        backend="hf",
    ),
    # torch built for the platform's GPUs.
    Capability("torch", "version.cuda", truthy=True, distribution="torch"),
    Capability("torch", "version.hip", truthy=True, distribution="torch"),
)


def missing(capability: Capability) -> str | None:
    """Why this Python lacks `capability` (one line), or None when it has it."""
    try:
        found: object = importlib.import_module(capability.module)
    except Exception as err:  # an extension failing to load raises anything
        return f"cannot import {capability.module} ({first_line(err)})"
    where = capability.module
    for part in capability.attribute.split(".") if capability.attribute else ():
        try:
            found = getattr(found, part)
        except AttributeError:
            return f"{where} has no {part}"
        except Exception as err:  # a lazy attribute (sglang.Engine) imports on access
            return f"{where}.{part} cannot be imported ({first_line(err)})"
        where = f"{where}.{part}"
    if capability.truthy and not found:
        return f"{where} is {found!r}"
    if capability.parameters:
        try:
            taken = inspect.signature(found).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError) as err:
            return f"{where} has no signature to inspect ({first_line(err)})"
        if lacking := [name for name in capability.parameters if name not in taken]:
            return f"{where} takes no {', '.join(lacking)}"
    return None
