"""The capability check, with the input's, before Ray starts: one line per capability the run
needs, or one line naming the first one missing and the recipe's pin of its package.

What a run needs: its backends' own capabilities (`BackendSpec.capabilities`) and the recipe's
``--require-capability`` of the backends it selects. Where each comes from: the pinned sets of
``--constraints``. It runs in `trainer.job.main.check_inputs`, so the launcher's check of the
job's input (before it claims the node and starts Ray) runs it too, in the Python the job will
run in; train.py runs it again on the node where the job landed, before ``ray.init``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from trainer.backends import registry
from trainer.backends.capabilities import CATALOGUE, Capability, missing
from trainer.config import TrainConfig
from trainer.errors import UsageError
from trainer.job.preflight import installed_version

CHECKOUT = Path(__file__).resolve().parents[2]  # --constraints paths are relative to it


def needed(config: TrainConfig) -> list[Capability]:
    """The capabilities `config` needs, in order: its backends' own, then the recipe's (those
    of a backend it does not select are not its needs)."""
    selected = registry.selected(config)
    names = [name for spec in selected for name in spec.capabilities]
    names += config.preflight.require_capability
    chosen = {spec.name for spec in selected}
    wanted = (CATALOGUE[name] for name in dict.fromkeys(names))
    return [c for c in wanted if c.backend is None or c.backend in chosen]


def pins(paths: Iterable[str], root: Path = CHECKOUT) -> dict[str, str]:
    """``name==version (FILE)`` of each distribution the constraints files pin (the first
    file pinning one wins), by canonical name."""
    found: dict[str, str] = {}
    for path in paths:
        try:
            text = (root / path).read_text(encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--constraints {path}: {err.strerror or err}") from None
        for line in text.splitlines():
            if pin := _pin(line):
                name, version = pin
                found.setdefault(canonicalize_name(name), f"{name}=={version} ({path})")
    return found


def _pin(line: str) -> tuple[str, str] | None:
    """The name and version a constraints line pins with ``==``; None for other lines."""
    text = line.split("#", 1)[0].strip()
    try:
        requirement = Requirement(text)
    except InvalidRequirement:  # blank, a pip option (-c, --index-url), an URL
        return None
    versions = [spec.version for spec in requirement.specifier if spec.operator == "=="]
    return (requirement.name, versions[0]) if versions else None


def check(config: TrainConfig, emit: Callable[[str], None] = print) -> None:
    """Emit ``capability NAME: ok (DIST VERSION)`` for each capability `config` needs; raise
    `UsageError` (one line) at the first one missing, naming its pin."""
    constraints = config.preflight.constraints
    pinned = pins(constraints)
    for capability in needed(config):
        version = installed_version(capability.distribution)
        installed = f"{capability.distribution} {version or '(no version)'}"
        if (why := missing(capability)) is None:
            emit(f"capability {capability.name}: ok ({installed})")
            continue
        where = f"{installed}: {why}" if version else why
        if pin := pinned.get(canonicalize_name(capability.distribution)):
            remedy = f"install the recipe's pin, {pin}"
        elif constraints:
            files = ", ".join(constraints)
            remedy = f"no pin of {capability.distribution} in {files}: install one that has it"
        else:
            remedy = f"install a {capability.distribution} that has it"
        raise UsageError(f"capability {capability.name}: missing ({where}); {remedy}")
