"""After an intended launcher change, one ``pytest --snapshot-update`` run is green.

A copy of this checkout gets a new default for a seed value (the AMD recipe's learning rate);
the snapshot, record-isolation and CLI tests then run once with ``--snapshot-update`` and once
without. No test may hold a second copy of what a snapshot holds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support.nested_pytest import run_pytest

ROOT = Path(__file__).resolve().parents[2]
COPIED = (
    "common",
    "harness",
    "launchers",
    "trainer",
    "tests",
    "conftest.py",
    "pyproject.toml",
    "train.py",
)
TESTS = (
    "tests/launchers/test_snapshots.py",
    "tests/harness/test_record_isolation.py",
    "tests/harness/test_cli.py",
)


def pytest_in(tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return run_pytest(*TESTS, *args, cwd=tree, env=env, timeout=300)


def test_snapshot_update_is_green_in_one_run(tmp_path):
    tree = tmp_path / "tree"
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, tree / name)
    recipe = tree / "launchers" / "recipes" / "qwen3_4b.py"
    old = "OptimizerConfig(lr=2e-5,"  # a recipe's default: one line of one file
    assert recipe.read_text().count(old) == 1
    recipe.write_text(recipe.read_text().replace(old, old.replace("2e-5", "3e-5")))

    updated = pytest_in(tree, "--snapshot-update")
    assert updated.returncode == 0, updated.stdout[-3000:]
    snapshot = tree / "tests/snapshots/launchers/amd/run_qwen3_4b_lora/train.txt"
    assert "--lr 3e-05 \\\n" in snapshot.read_text()
    again = pytest_in(tree)
    assert again.returncode == 0, again.stdout[-3000:]
