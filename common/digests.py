"""A file's sha256, read in blocks: what wheelhouse and bundle manifests record and check."""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCK = 2**20


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()
