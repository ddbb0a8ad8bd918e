"""harness/ modules import one another in one direction: no cycle, not even a deferred one."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[2] / "harness"


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


def test_launchers_record_without_live_modes_packages():
    """Recording and dry runs need the base install only: psutil (the `ray` extra) is imported
    by live mode alone."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psutil'] = None\n"
        "from harness.cli import run\n"
        "from launchers.amd.run_qwen3_4b_lora import LAUNCHER\n"
        "sys.exit(run(LAUNCHER, ['train', '--dry-run', '--hardware', 'MI355X']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=HARNESS.parent, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "python3 train.py" in done.stdout
