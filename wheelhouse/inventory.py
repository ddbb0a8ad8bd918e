"""What a node has: its Python, the platform tags it accepts and its installed distributions.

Runs ON the node, so standard library only.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
import sysconfig

from wheelhouse.names import normalize

# Oldest glibc minor each architecture's manylinux tags start at, and the legacy aliases.
_MANYLINUX_FLOOR = {"x86_64": 5, "i686": 5}
_LEGACY_ALIASES = {
    (2, 17): "manylinux2014",
    (2, 12): "manylinux2010",
    (2, 5): "manylinux1",
}
_LEGACY_ARCHES = {
    "manylinux2014": {"x86_64", "i686", "aarch64", "armv7l", "ppc64", "ppc64le", "s390x"},
    "manylinux2010": {"x86_64", "i686"},
    "manylinux1": {"x86_64", "i686"},
}


def glibc_version() -> tuple[int, int] | None:
    """The C library's version when it is glibc (`os.confstr('CS_GNU_LIBC_VERSION')`)."""
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        return None
    name, _, version = text.partition(" ")
    if name != "glibc":
        return None
    major, _, minor = version.partition(".")
    try:
        return int(major), int(minor.split(".")[0])
    except ValueError:
        return None


def platform_tags(plat: str, glibc: tuple[int, int] | None) -> list[str]:
    """Platform tags this node accepts, most specific first (as pip orders them)."""
    base = plat.replace("-", "_").replace(".", "_")
    if not base.startswith("linux_"):
        return [base]
    arch = base.removeprefix("linux_")
    tags: list[str] = []
    if glibc is not None and glibc[0] == 2:
        floor = _MANYLINUX_FLOOR.get(arch, 17)
        for minor in range(glibc[1], floor - 1, -1):
            tags.append(f"manylinux_2_{minor}_{arch}")
            legacy = _LEGACY_ALIASES.get((2, minor))
            if legacy and arch in _LEGACY_ARCHES[legacy]:
                tags.append(f"{legacy}_{arch}")
    tags.append(base)
    return tags


def expand_platform(tag: str) -> list[str]:
    """`manylinux_2_34_x86_64` -> every manylinux tag a glibc 2.34 node accepts (pip does not
    expand these by itself); other tags unchanged."""
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    if not match:
        return [tag]
    major, minor, arch = int(match[1]), int(match[2]), match[3]
    return platform_tags(f"linux-{arch}", (major, minor))


def python_abi() -> str:
    """The interpreter's ABI tag, e.g. `cp312` (`cp313t` when free-threaded)."""
    if sys.implementation.name != "cpython":
        return sys.implementation.cache_tag.replace("-", "_")
    threaded = "t" if sysconfig.get_config_var("Py_GIL_DISABLED") else ""
    return f"cp{sys.version_info.major}{sys.version_info.minor}{threaded}"


def installed_distributions() -> list[dict]:
    """Every distribution importable here: name (normalised), version and Requires-Dist.

    Where one name is installed twice, the first on `sys.path` wins, as for imports.
    """
    found: dict[str, dict] = {}
    for dist in importlib.metadata.distributions():
        raw = dist.metadata["Name"]
        if not raw:
            continue
        name = normalize(raw)
        if name not in found:
            found[name] = {"name": name, "version": dist.version, "requires": dist.requires or []}
    return [found[name] for name in sorted(found)]


def inventory() -> dict:
    """The node's description that `build --inventory` reads."""
    glibc = glibc_version()
    plat = sysconfig.get_platform()
    return {
        "format": 1,
        "python": {
            "version": platform.python_version(),
            "implementation": sys.implementation.name,
            "abi": python_abi(),
        },
        "platform": plat,
        "glibc": f"{glibc[0]}.{glibc[1]}" if glibc else None,
        "platform_tags": platform_tags(plat, glibc),
        "distributions": installed_distributions(),
    }
