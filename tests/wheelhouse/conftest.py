"""Fixtures of the wheelhouse tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def pip_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's own configuration (mirrors, global constraints) switched off for this test."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
