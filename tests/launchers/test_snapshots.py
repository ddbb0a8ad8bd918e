"""Every launcher entrypoint, recorded hermetically, matches its snapshot under tests/snapshots/.

Launchers are discovered, so a new one is covered without editing this file. `pytest
--snapshot-update` writes new snapshots and deletes orphans; review the diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from harness import LaunchContext, Launcher, LauncherArgs, LaunchError, build_plan
from harness.discovery import discover_launchers
from harness.record import record
from harness.snapshot import (
    SNAPSHOT_ROOT,
    LauncherSnapshotExtension,
    missing_snapshot,
    orphan_snapshots,
    snapshot_path,
)

LAUNCHERS = discover_launchers()
CASES = [(launcher, name) for launcher in LAUNCHERS for name in launcher.recordings]


@pytest.mark.parametrize(
    ("launcher", "entrypoint"), CASES, ids=[f"{lau.path}:{name}" for lau, name in CASES]
)
def test_recording_matches_snapshot(launcher, entrypoint, launcher_snapshot):
    recording = record(launcher, entrypoint)
    assert recording.text == launcher_snapshot(recording.snapshot_name)


def test_known_launchers_are_discovered():
    modules = {launcher.module for launcher in LAUNCHERS}
    assert {"launchers.amd.run_qwen3_4b_lora", "launchers.cpu.run_tiny_qwen3_lora"} <= modules
    amd = next(lau for lau in LAUNCHERS if lau.module == "launchers.amd.run_qwen3_4b_lora")
    assert amd.entrypoint_names == ("prepare", "train", "full_train", "worker", "sbatch", "rayjob")
    two_nodes = {"train_2_nodes", "worker_2_nodes", "sbatch_2_nodes", "rayjob_2_nodes"}
    assert two_nodes | {"rayjob"} <= set(amd.recordings)
    assert amd.recorded_hardware == "MI355X"


def test_no_snapshot_without_a_launcher(request):
    names = [f"{launcher.path}/{name}" for launcher, name in CASES]
    orphans = orphan_snapshots(names)
    if orphans and request.config.option.update_snapshots:
        for path in orphans:
            path.unlink()
            for folder in path.parents:
                if folder == SNAPSHOT_ROOT or any(folder.iterdir()):
                    break
                folder.rmdir()
        return
    stray = [str(path.relative_to(SNAPSHOT_ROOT)) for path in orphans]
    assert not stray, f"snapshots without a launcher entrypoint: {stray} (run --snapshot-update)"


def test_a_missing_snapshot_names_its_file_and_the_fix(tmp_path):
    assert missing_snapshot("launchers/amd/run_qwen3_4b_lora/train") is None
    reason = missing_snapshot("launchers/new/run_x/train", tmp_path)
    assert reason is not None
    assert f"no snapshot {tmp_path}/launchers/new/run_x/train.txt" in reason
    assert (
        "`pytest tests/launchers/test_snapshots.py --snapshot-update -k launchers/new/run_x`"
        in reason
    )


def test_orphan_detection(tmp_path):
    for name in ("launchers/a/x/train", "launchers/a/x/gone", "launchers/old/prepare"):
        snapshot_path(name, tmp_path).parent.mkdir(parents=True, exist_ok=True)
        snapshot_path(name, tmp_path).write_text("x")
    assert orphan_snapshots(["launchers/a/x/train"], tmp_path) == [
        tmp_path / "launchers/a/x/gone.txt",
        tmp_path / "launchers/old/prepare.txt",
    ]


def test_snapshot_files_mirror_launcher_paths(tmp_path):
    class Extension(LauncherSnapshotExtension):
        root = tmp_path

    extension = Extension()
    name = "launchers/amd/run_qwen3_4b_lora/train"
    location = extension.get_location(test_location=None, index=name)  # type: ignore[arg-type]
    assert Path(location) == tmp_path / "launchers/amd/run_qwen3_4b_lora/train.txt"
    assert snapshot_path(name) == SNAPSHOT_ROOT / "launchers/amd/run_qwen3_4b_lora/train.txt"
    # None makes syrupy fail the assertion: a launcher without a snapshot fails the suite.
    read = extension.read_snapshot_data_from_location
    assert read(snapshot_location=location, snapshot_name=name, session_id="s") is None
    Path(location).parent.mkdir(parents=True)
    Path(location).write_text("# launcher\n")
    assert read(snapshot_location=location, snapshot_name=name, session_id="s") == "# launcher\n"


@dataclass(frozen=True)
class SilentArgs(LauncherArgs):
    hardware: Literal["CPU"] = "CPU"


def silent(ctx: LaunchContext, args: SilentArgs) -> None:
    """Emits nothing: a launcher bug the suite must catch."""


def test_an_entrypoint_that_emits_no_step_fails():
    launcher = Launcher(__name__, args=SilentArgs, entrypoints=(silent,), recorded_hardware="CPU")
    with pytest.raises(LaunchError, match="silent emitted no step"):
        build_plan(launcher, "silent")
