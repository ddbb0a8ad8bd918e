"""Small real wheels (zipfile + METADATA + WHEEL + RECORD) for the wheelhouse tests."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import tarfile
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


def write_sdist(folder: Path, name: str, version: str, build_imports: tuple[str, ...] = ()) -> Path:
    """A real setuptools source distribution with one module, `NAME.py`; its `setup.py`
    imports `build_imports` first (as Transformer Engine's extension needs its core to build)."""
    root = f"{name}-{version}"
    files = {
        f"{root}/pyproject.toml": (
            '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "{name}"\nversion = "{version}"\n'
            f'[tool.setuptools]\npy-modules = ["{name}"]\n'
        ),
        f"{root}/setup.py": "".join(f"import {m}\n" for m in build_imports)
        + "from setuptools import setup\n\nsetup()\n",
        f"{root}/{name}.py": "BUILT_ON_THE_NODE = True\n",
        f"{root}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{root}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for member, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
