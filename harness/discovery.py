"""Find every launcher: modules under ``launchers/`` that define ``LAUNCHER = Launcher(...)``."""

from __future__ import annotations

import importlib
import pkgutil

from harness.launcher import Launcher

PACKAGE = "launchers"


def discover_launchers(package: str = PACKAGE) -> list[Launcher]:
    """The launchers declared in `package` and its subpackages, sorted by module name."""
    root = importlib.import_module(package)
    found = []
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        module = importlib.import_module(info.name)
        launcher = getattr(module, "LAUNCHER", None)
        if isinstance(launcher, Launcher) and launcher.module == info.name:
            found.append(launcher)
    return sorted(found, key=lambda launcher: launcher.module)
