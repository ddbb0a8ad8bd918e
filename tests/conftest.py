"""Fixtures of the harness and launcher tests."""

from __future__ import annotations

import pytest

from harness.snapshot import LauncherSnapshotExtension


@pytest.fixture
def launcher_snapshot(snapshot):
    """syrupy's snapshot fixture, storing plain text under tests/snapshots/<launcher path>/."""
    return snapshot.use_extension(LauncherSnapshotExtension)
