"""harness/ modules import one another in one direction: no cycle, not even a deferred one."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"


def harness_imports(path: Path) -> set[str]:
    """Every ``harness.<module>`` that `path` imports, at any depth (functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("harness.")}
    return found - {path.stem}


def test_harness_has_no_import_cycle():
    graph = {path.stem: harness_imports(path) for path in HARNESS.glob("*.py")}
    graph.pop("__init__")
    assert graph["launcher"] and graph["context"]  # the scan sees imports
    order = list(graphlib.TopologicalSorter(graph).static_order())  # CycleError on a cycle
    assert order.index("launcher") < order.index("context") < order.index("cli")
