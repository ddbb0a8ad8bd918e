"""Distribution names, versions and wheel file names (PEP 503, PEP 440, PEP 427), stdlib only."""

from __future__ import annotations

import re

_NAME_RUN = re.compile(r"[-_.]+")


def normalize(name: str) -> str:
    """PEP 503 normal form: lower case, runs of `-`, `_`, `.` as one `-`."""
    return _NAME_RUN.sub("-", name).lower()


def public_version(version: str) -> str:
    """The version without its local part: `2.11.0+cu130` -> `2.11.0` (PyPI has no local parts)."""
    return version.split("+", 1)[0]


def wheel_name_version(filename: str) -> tuple[str, str]:
    """Normalised distribution name and version of a wheel file name."""
    parts = filename.rsplit("/", 1)[-1].split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {filename}")
    return normalize(parts[0]), parts[1]
