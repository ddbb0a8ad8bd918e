"""Fixtures of the harness and launcher tests."""

from __future__ import annotations

import pytest

from harness.snapshot import LauncherSnapshotExtension
from tests.private_ray import PrivateRay


@pytest.fixture
def launcher_snapshot(snapshot):
    """syrupy's snapshot fixture, storing plain text under tests/snapshots/<launcher path>/."""
    return snapshot.use_extension(LauncherSnapshotExtension)


@pytest.fixture
def private_ray():
    """A local Ray of this test's own (temp dir, ports, tag), stopped even when the test fails."""
    cluster = PrivateRay()
    try:
        yield cluster
    finally:
        cluster.cleanup()
