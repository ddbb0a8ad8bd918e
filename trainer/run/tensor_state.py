"""A nested state dict as data: its tensors in a safetensors file, the rest in a JSON skeleton.

Optimizer, LR-scheduler and RNG states are nested dicts, lists and tuples of tensors and
scalars, with int keys (an optimizer's parameter ids). ``torch.save`` stores them as a pickle,
which runs whatever code the file names when it is loaded. Here `save` writes ``<stem>.json``
and ``<stem>.safetensors`` and `load` rebuilds the same structure from them: nothing in either
file is executed, and a file that is not such a state is one `StateFormatError` line.

The skeleton keeps what JSON alone would lose: a JSON array is a list; an object is one tagged
node, ``{"dict": [[key, value], ...]}`` (str or int keys, in order), ``{"tuple": [...]}``,
``{"tensor": "<name in the safetensors file>"}`` or ``{"float": "nan" | "inf" | "-inf"}``;
None, booleans, ints, finite floats and strings are themselves. Tensors keep their dtype,
shape and bits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

FORMAT = "grpo-lora-state/1"
JSON_SUFFIX = ".json"
TENSORS_SUFFIX = ".safetensors"
_NON_FINITE = ("nan", "inf", "-inf")


class StateFormatError(ValueError):
    """A state file that is not what `save` writes (one line)."""


def split(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(the JSON skeleton, its tensors by name) of `state`; a value that is neither a tensor,
    a scalar, a string, None nor a dict, list or tuple of those is a TypeError."""
    tensors: dict[str, torch.Tensor] = {}
    return _encode(state, "state", tensors), tensors


def join(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The state `split` took apart; `StateFormatError` for a skeleton `split` cannot make."""
    return _decode(skeleton, tensors, "state")


def paths(stem: Path) -> tuple[Path, Path]:
    """The JSON skeleton and the safetensors file of the state saved at `stem`."""
    return stem.with_name(stem.name + JSON_SUFFIX), stem.with_name(stem.name + TENSORS_SUFFIX)


def save(state: Any, stem: Path) -> None:
    """Write `state` to ``<stem>.json`` and ``<stem>.safetensors`` (new files: the caller's
    directory is one a checkpoint is being written into)."""
    from safetensors.torch import save_file

    skeleton, tensors = split(state)
    skeleton_file, tensors_file = paths(stem)
    save_file(tensors, str(tensors_file))
    text = json.dumps({"format": FORMAT, "state": skeleton}, allow_nan=False)
    skeleton_file.write_text(text + "\n", encoding="utf-8")


def load(stem: Path) -> Any:
    """The state `save` wrote at `stem`, its tensors on the CPU."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    skeleton_file, tensors_file = paths(stem)
    skeleton = _read_skeleton(skeleton_file)
    try:
        tensors = load_file(str(tensors_file))
    except SafetensorError as err:
        raise StateFormatError(f"{tensors_file}: not a complete safetensors file ({err})") from None
    return _join_in(skeleton_file, skeleton, tensors)


def check(stem: Path) -> None:
    """Raise `StateFormatError` (or ``OSError``) unless `load` would read the state at `stem`;
    reads the skeleton and the safetensors header only, not the tensors."""
    from safetensors import SafetensorError, safe_open

    skeleton_file, tensors_file = paths(stem)
    skeleton = _read_skeleton(skeleton_file)
    try:
        with safe_open(str(tensors_file), framework="pt") as tensors:
            names = dict.fromkeys(tensors.keys())
    except SafetensorError as err:
        raise StateFormatError(f"{tensors_file}: not a complete safetensors file ({err})") from None
    _join_in(skeleton_file, skeleton, names)


def _read_skeleton(skeleton_file: Path) -> Any:
    try:
        document = json.loads(skeleton_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise StateFormatError(f"{skeleton_file}: not valid JSON ({err})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise StateFormatError(f"{skeleton_file}: not a {FORMAT} state file")
    return document.get("state")


def _join_in(skeleton_file: Path, skeleton: Any, tensors: Mapping[str, Any]) -> Any:
    try:
        return join(skeleton, tensors)
    except StateFormatError as err:
        raise StateFormatError(f"{skeleton_file}: {err}") from None


def _encode(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    import torch

    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.Tensor):
        name = path if path not in tensors else f"{path}#{len(tensors)}"
        # an own contiguous CPU copy: safetensors refuses views that share memory
        tensors[name] = value.detach().to("cpu", copy=True).contiguous()
        return {"tensor": name}
    if isinstance(value, list):
        return [_encode(item, f"{path}/{i}", tensors) for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, f"{path}/{i}", tensors) for i, item in enumerate(value)]}
    if isinstance(value, dict):
        pairs = []
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(f"{path}: a {type(key).__name__} key cannot be saved as data")
            pairs.append([key, _encode(item, f"{path}/{key}", tensors)])
        return {"dict": pairs}
    raise TypeError(f"{path}: a {type(value).__name__} cannot be saved as data")


def _decode(node: Any, tensors: Mapping[str, torch.Tensor], path: str) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(item, tensors, f"{path}/{i}") for i, item in enumerate(node)]
    if isinstance(node, dict) and len(node) == 1:
        ((tag, body),) = node.items()
        if tag == "tensor" and isinstance(body, str):
            if body not in tensors:
                raise StateFormatError(f"{path}: names tensor {body!r}, which the file lacks")
            return tensors[body]
        if tag == "float" and body in _NON_FINITE:
            return float(body)
        if tag == "tuple" and isinstance(body, list):
            return tuple(_decode(item, tensors, f"{path}/{i}") for i, item in enumerate(body))
        if tag == "dict" and isinstance(body, list):
            return _decode_dict(body, tensors, path)
    shown = json.dumps(node)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise StateFormatError(f"{path}: {shown} is not a state value")


def _decode_dict(pairs: list[Any], tensors: Mapping[str, torch.Tensor], path: str) -> dict:
    decoded: dict[str | int, Any] = {}
    for pair in pairs:
        valid = isinstance(pair, list) and len(pair) == 2
        key = pair[0] if valid else None
        if not valid or isinstance(key, bool) or not isinstance(key, (str, int)):
            raise StateFormatError(f"{path}: a dict entry must be a [str or int key, value] pair")
        if key in decoded:
            raise StateFormatError(f"{path}: key {key!r} appears twice")
        decoded[key] = _decode(pair[1], tensors, f"{path}/{key}")
    return decoded
