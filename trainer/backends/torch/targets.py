"""The modules the PEFT trainer adapts: PEFT's LoRA config of the flags, checked before launch.

PEFT wraps the model that the checkpoint's ``config.json`` describes, built on the meta device
(no weight is read or allocated: 0.27 s for Qwen3-0.6B's shape and 0.46 s for Qwen3-4B's with
an r64 all-linear adapter, on 2 CPU cores), with the trainer's own LoRA config. So a
``--target-modules`` entry that matches no module, or, with ``--lora-serving merged``, one
that matches a layer that is not linear (merging adds ``B @ A`` to a linear weight), is one
line before Ray starts instead of an error in the trainer's actor. Imports torch,
transformers and PEFT only when called.
"""

from __future__ import annotations

import difflib
import warnings
from typing import TYPE_CHECKING, Any

from trainer.backends.megatron.lora_names import PEFT_PREFIX
from trainer.errors import first_line

if TYPE_CHECKING:
    from trainer.config import LoraConfig, TrainConfig


def peft_lora_config(lora: LoraConfig) -> Any:
    """PEFT's ``LoraConfig`` of the LoRA group; PEFT matches the module names (``all-linear``:
    every linear layer but the output layer) against the model."""
    from peft import LoraConfig as PeftLoraConfig

    modules = lora.modules()
    return PeftLoraConfig(
        r=lora.lora_rank,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=modules if isinstance(modules, str) else list(modules),
        exclude_modules=list(lora.excluded()) or None,
        task_type="CAUSAL_LM",
    )


def unmergeable_layer(model: Any) -> str | None:
    """Why PEFT `model` cannot be served merged: its first LoRA layer that does not wrap a
    ``torch.nn.Linear`` (an embedding, or GPT-2's transposed ``Conv1D``, which PEFT's LoRA
    ``Linear`` also wraps)."""
    import torch
    from peft.tuners.lora.layer import Linear
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, layer in model.named_modules():
        if not isinstance(layer, BaseTunerLayer):
            continue
        wrapped = layer.get_base_layer() if isinstance(layer, Linear) else layer
        if not isinstance(wrapped, torch.nn.Linear):
            return (
                f"--lora-serving merged merges linear layers; {name.removeprefix(PEFT_PREFIX)} "
                f"is a {type(wrapped).__name__}: leave it out of --target-modules"
            )
    return None


def unmatched_targets(targets: str | tuple[str, ...], model: Any) -> str | None:
    """The first listed target no module of `model` answers to by PEFT's rule for a list (its
    name, or its name's last dotted parts), with the closest names it has; None for
    ``all-linear``, which PEFT resolves itself."""
    if isinstance(targets, str):
        return None
    names = [name for name, _ in model.named_modules()]
    for target in targets:
        if not any(name == target or name.endswith(f".{target}") for name in names):
            leaves = sorted({name.rsplit(".", 1)[-1] for name in names})
            close = difflib.get_close_matches(target, leaves, n=3, cutoff=0.6)
            return f"{target!r}" + (f" (did you mean {', '.join(close)}?)" if close else "")
    return None


def problem(config: TrainConfig) -> str | None:
    """The PEFT trainer's check of the checkpoint against the LoRA flags: the first problem."""
    import torch

    # A probe: the libraries' warnings come again, where they matter, when the trainer builds it.
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _meta_problem(config)


def _meta_problem(config: TrainConfig) -> str | None:
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    path = config.checkpoint.hf_checkpoint
    try:
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    except (OSError, ValueError, KeyError) as err:
        return f"--hf-checkpoint {path}: transformers cannot build its model ({first_line(err)})"
    if missing := unmatched_targets(config.lora.modules(), base):
        return f"--target-modules: {path} has no module named {missing}"
    try:
        model = get_peft_model(base, peft_lora_config(config.lora))
    except ValueError as err:  # e.g. all-linear where PEFT finds no linear layer
        return f"--target-modules: PEFT cannot adapt {path} ({first_line(err)})"
    if config.lora.merged:
        return unmergeable_layer(model)
    return None


def adapter_shapes(config: TrainConfig) -> dict[str, tuple[int, ...]]:
    """Name and shape of every tensor of the adapter the PEFT trainer trains for `config`, as
    PEFT saves it (``adapter_model.safetensors``), from the model built on the meta device."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(config.checkpoint.hf_checkpoint)
        )
        model = get_peft_model(base, peft_lora_config(config.lora))
        return {name: tuple(t.shape) for name, t in get_peft_model_state_dict(model).items()}
