"""Find every launcher: each ``launchers/**/run_*.py`` declares ``LAUNCHER = Launcher(...)``.

Discovery goes by file, not by package walk, so a launcher in a folder without ``__init__.py``
is found too (its snapshots are never taken for orphans), and a ``run_*.py`` file that declares
no launcher of its own is an error rather than silently skipped.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from harness.errors import LaunchError
from harness.host import CHECKOUT
from harness.launcher import Launcher

PACKAGE = "launchers"
PATTERN = "run_*.py"


def discover_launchers(package: str = PACKAGE, root: str = CHECKOUT) -> list[Launcher]:
    """The launcher of every ``<root>/<package>/**/run_*.py``, sorted by module name."""
    found = []
    for path in sorted((Path(root) / package).rglob(PATTERN)):
        relative = path.relative_to(root)
        name = ".".join(relative.with_suffix("").parts)
        launcher = declared_launcher(name, where=str(relative))
        if launcher.module != name:
            raise LaunchError(f"{relative}: its LAUNCHER is declared in {launcher.module}")
        found.append(launcher)
    return sorted(found, key=lambda launcher: launcher.module)


def declared_launcher(module: str, *, where: str | None = None) -> Launcher:
    """The ``LAUNCHER`` that `module` declares (`where` names it in an error: its file)."""
    try:
        launcher = getattr(importlib.import_module(module), "LAUNCHER", None)
    except ImportError as err:
        raise LaunchError(f"no launcher module {module} ({err})") from None
    if not isinstance(launcher, Launcher):
        raise LaunchError(f"{where or module} declares no LAUNCHER = Launcher(...)")
    return launcher
