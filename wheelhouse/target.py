"""The node a wheelhouse is built for: Python, platform tags and what it already has."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from wheelhouse.batches import WheelhouseError
from wheelhouse.names import normalize, public_version

_IMPLEMENTATIONS = {"cpython": "cp", "pypy": "pp"}


@dataclass(frozen=True)
class Target:
    python_version: str
    platforms: tuple[str, ...]
    implementation: str = "cp"
    have: dict[str, str] = field(default_factory=dict)

    def pip_args(self) -> list[str]:
        """pip's options that select wheels for this node rather than for this machine."""
        args = ["--only-binary=:all:", "--python-version", self.python_version]
        args += ["--implementation", self.implementation]
        for plat in self.platforms:
            args += ["--platform", plat]
        return args

    def has(self, name: str, version: str) -> bool:
        """Whether the node has this distribution at this public version."""
        have = self.have.get(normalize(name))
        return have is not None and same_public_version(have, version)


def same_public_version(a: str, b: str) -> bool:
    try:
        return Version(public_version(a)) == Version(public_version(b))
    except InvalidVersion:
        return public_version(a) == public_version(b)


def from_inventory(path: Path) -> Target:
    try:
        data = json.loads(path.read_text())
        python = data["python"]
        major_minor = ".".join(python["version"].split(".")[:2])
        implementation = _IMPLEMENTATIONS.get(python["implementation"], python["implementation"])
        have = {normalize(d["name"]): d["version"] for d in data["distributions"]}
        platforms = tuple(data["platform_tags"])
    except OSError as err:
        raise WheelhouseError(f"cannot read inventory {path}: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise WheelhouseError(
            f"{path} is not an inventory (write one with `python -m wheelhouse inventory`)"
        ) from None
    return Target(major_minor, platforms, implementation, have)
