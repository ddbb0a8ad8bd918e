"""Small real wheels (zipfile + METADATA + WHEEL + RECORD) for the wheelhouse tests."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    folder: Path,
    name: str,
    version: str,
    files: dict[str, bytes] | None = None,
    requires: list[str] | None = None,
    extras: list[str] | None = None,
    tag: str = "py3-none-any",
) -> Path:
    """Write `name-version-tag.whl` into `folder` and return its path."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Provides-Extra: {e}\n" for e in extras or [])
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires or [])
    members = dict(files if files is not None else {f"{dist}/__init__.py": b"VALUE = 1\n"})
    members[f"{info}/METADATA"] = metadata.encode()
    members[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"
    ).encode()
    rows = [[path, _hash(data), str(len(data))] for path, data in members.items()]
    rows.append([f"{info}/RECORD", "", ""])
    record = io.StringIO()
    csv.writer(record, lineterminator="\n").writerows(rows)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr(f"{info}/RECORD", record.getvalue())
    return path
