"""Launcher discovery goes by file: every ``launchers/**/run_*.py`` is a launcher or an error."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from harness.discovery import discover_launchers
from harness.errors import LaunchError

COMMON = """
from dataclasses import dataclass
from typing import Literal

from harness import LauncherArgs, Shell, arg


@dataclass(frozen=True)
class Args(LauncherArgs):
    hardware: Literal["CPU"] = arg("CPU", "CPU only")


def train(ctx, args):
    ctx.emit(Shell(("true",)))
"""
LAUNCHER = '''
"""A launcher whose entrypoints live in another module."""
from harness import Launcher
from {package}.common import Args, train

LAUNCHER = Launcher(__name__, args=Args, entrypoints=(train,), recorded_hardware="CPU")
'''


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"discovered_{uuid.uuid4().hex}"  # a fresh package: nothing cached from another test
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tmp_path, f"{name}/__init__.py", "")
    write(tmp_path, f"{name}/common.py", COMMON)
    return name


def test_a_launcher_in_a_folder_without_init_is_found_under_its_own_name(tmp_path, package):
    write(tmp_path, f"{package}/no_init/run_shared.py", LAUNCHER.format(package=package))
    (launcher,) = discover_launchers(package, str(tmp_path))
    assert launcher.module == f"{package}.no_init.run_shared"
    assert launcher.path == f"{package}/no_init/run_shared"
    assert launcher.summary == "A launcher whose entrypoints live in another module."


def test_a_run_file_without_launcher_fails(tmp_path, package):
    write(tmp_path, f"{package}/run_ok.py", LAUNCHER.format(package=package))
    write(tmp_path, f"{package}/sub/run_nothing.py", "X = 1\n")
    with pytest.raises(LaunchError, match=rf"{package}/sub/run_nothing.py declares no LAUNCHER"):
        discover_launchers(package, str(tmp_path))


def test_a_run_file_reexporting_another_launcher_fails(tmp_path, package):
    write(tmp_path, f"{package}/run_ok.py", LAUNCHER.format(package=package))
    write(tmp_path, f"{package}/run_copy.py", f"from {package}.run_ok import LAUNCHER\n")
    with pytest.raises(LaunchError, match=rf"its LAUNCHER is declared in {package}.run_ok"):
        discover_launchers(package, str(tmp_path))


def test_the_project_launchers_are_found():
    modules = [launcher.module for launcher in discover_launchers()]
    files = sorted(Path(__file__).resolve().parents[2].glob("launchers/**/run_*.py"))
    assert len(modules) == len(files) >= 3
