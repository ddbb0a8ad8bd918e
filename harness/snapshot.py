"""Launcher snapshots on disk: one plain-text file per entrypoint, compared through syrupy.

``tests/snapshots/<launcher path>/<entrypoint>.txt`` holds the recording of that entrypoint,
e.g. ``tests/snapshots/launchers/amd/run_qwen3_4b_lora/train.txt``. Syrupy compares, diffs and,
with ``--snapshot-update``, writes them. Orphans (a file whose launcher or entrypoint is gone)
are found by `orphan_snapshots` from the discovered launchers, not by syrupy's unused-snapshot
scan, which cannot relate these paths to test names.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from syrupy.data import SnapshotCollections
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from harness.host import CHECKOUT

if TYPE_CHECKING:
    from syrupy.location import PyTestLocation
    from syrupy.types import SnapshotIndex

SNAPSHOT_ROOT = Path(CHECKOUT) / "tests" / "snapshots"
SUFFIX = ".txt"
# Writes the snapshots of the selected launchers (-k PATH), in the checkout's root.
UPDATE_COMMAND = "pytest tests/launchers/test_snapshots.py --snapshot-update"


def snapshot_path(name: str, root: Path = SNAPSHOT_ROOT) -> Path:
    """The file of recording `name` (``launchers/amd/run_qwen3_4b_lora/train``)."""
    return root / f"{name}{SUFFIX}"


def missing_snapshot(name: str, root: Path = SNAPSHOT_ROOT) -> str | None:
    """Why recording `name` cannot be compared (its file is missing, with the fix), else None."""
    path = snapshot_path(name, root)
    if path.is_file():
        return None
    shown = path.relative_to(CHECKOUT) if path.is_relative_to(CHECKOUT) else path
    launcher = name.rpartition("/")[0]
    return (
        f"no snapshot {shown} for {name}: record it with "
        f"`{UPDATE_COMMAND} -k {launcher}` and review the new file"
    )


def orphan_snapshots(names: Iterable[str], root: Path = SNAPSHOT_ROOT) -> list[Path]:
    """Snapshot files under `root` that no recording `names` accounts for."""
    expected = {snapshot_path(name, root) for name in names}
    return sorted(path for path in root.rglob(f"*{SUFFIX}") if path not in expected)


class LauncherSnapshotExtension(SingleFileSnapshotExtension):
    """Plain text at ``<root>/<name>.txt``; ``name`` comes from ``snapshot(name=...)``."""

    _write_mode = WriteMode.TEXT
    file_extension = SUFFIX[1:]
    root: ClassVar[Path] = SNAPSHOT_ROOT

    @classmethod
    def get_location(cls, *, test_location: PyTestLocation, index: SnapshotIndex) -> str:
        if not isinstance(index, str):
            raise TypeError("launcher snapshots are named: snapshot(name=recording.snapshot_name)")
        return str(snapshot_path(index, cls.root))

    @classmethod
    def dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(cls.root)

    @classmethod
    def discovery_dirname(cls, *, test_location: PyTestLocation) -> str:
        return str(cls.root)

    def discover_snapshots(
        self, *, test_location: PyTestLocation, ignore_extensions: list[str] | None = None
    ) -> SnapshotCollections:
        return SnapshotCollections()

    @classmethod
    def matches_test_location(
        cls, *, test_location: PyTestLocation, snapshot_location: str
    ) -> bool:
        return Path(snapshot_location).is_relative_to(cls.root)
