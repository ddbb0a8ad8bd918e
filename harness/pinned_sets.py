"""The pinned sets a trainer argv names (``--constraints``), each with a digest of its contents.

A recipe's recording names them with their digests (`harness.record`, and the header of a
``rayjob`` manifest), so a changed pin in one of them is a snapshot diff to review like any
other change of what a launch runs on. The files are the checkout's, which the recording
already depends on; the digest does not depend on the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from common.digests import file_sha256
from harness.host import CHECKOUT

FLAG = "--constraints"
DIGEST_CHARS = 16


def named(argv: Sequence[str]) -> tuple[str, ...]:
    """The paths after ``--constraints`` in `argv` (up to the next option)."""
    if FLAG not in argv:
        return ()
    rest = argv[argv.index(FLAG) + 1 :]
    end = next((i for i, token in enumerate(rest) if token.startswith("--")), len(rest))
    return tuple(rest[:end])


def described(argv: Sequence[str], checkout: str | Path = CHECKOUT) -> list[str]:
    """``PATH (sha256 DIGEST)`` for each pinned set `argv` names, read in `checkout`."""
    lines = []
    for path in named(argv):
        try:
            digest = file_sha256(Path(checkout) / path)
        except OSError:
            lines.append(f"{path} (not in the checkout)")
            continue
        lines.append(f"{path} (sha256 {digest[:DIGEST_CHARS]})")
    return lines
