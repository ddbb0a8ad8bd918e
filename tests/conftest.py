"""Fixtures of the harness and launcher tests."""

from __future__ import annotations

import pytest

from harness.snapshot import LauncherSnapshotExtension, missing_snapshot
from tests.private_ray import PrivateRay


@pytest.fixture
def launcher_snapshot(snapshot, request):
    """The stored snapshot of a recording name (plain text under tests/snapshots/), via syrupy.

    Without ``--snapshot-update`` a missing file fails with its path and the command that
    writes it.
    """
    stored = snapshot.use_extension(LauncherSnapshotExtension)
    updating = request.config.option.update_snapshots

    def expected(name: str):
        if not updating and (reason := missing_snapshot(name)):
            pytest.fail(reason, pytrace=False)
        return stored(name=name)

    return expected


@pytest.fixture
def private_ray():
    """A local Ray of this test's own (temp dir, ports, tag), stopped even when the test fails."""
    cluster = PrivateRay()
    try:
        yield cluster
    finally:
        cluster.cleanup()
