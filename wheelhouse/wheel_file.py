"""Write a wheel: its files, `METADATA`, `WHEEL` and a `RECORD` of their hashes (PEP 427).
Standard library only (runs on the node)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(
    folder: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    tag: str = "py3-none-any",
    summary: str = "",
) -> Path:
    """`folder/{name}-{version}-{tag}.whl` holding `files` (archive path -> contents), purelib."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if summary:
        metadata += f"Summary: {summary}\n"
    members = {
        **files,
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: wheelhouse\nRoot-Is-Purelib: true\nTag: {tag}\n"
        ).encode(),
    }
    record = "".join(f"{path},{record_hash(data)},{len(data)}\n" for path, data in members.items())
    members[f"{info}/RECORD"] = f"{record}{info}/RECORD,,\n".encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in members.items():
            archive.writestr(member, data)
    return path
