"""Merge what pip installed into a staging folder into a shared `--target` folder, file by file.

pip's `install --target DIR --upgrade` replaces every top-level folder a wheel writes to. Where
several distributions share a folder, that loses files: Ray's `opentelemetry-sdk` and
`opentelemetry-exporter-*` vanished when SGLang's wheelhouse brought `opentelemetry-api` into the
same target (`opentelemetry/` is a namespace package), and Transformer Engine's PyTorch
extension, which adds files under the core wheel's `transformer_engine/`, would replace the
core. Without `--upgrade` pip skips such folders instead, silently.

Here every file has an owner, read from the distributions' `RECORD` files. Installing a
distribution removes the files of its earlier version (an upgrade, as pip does in an
environment), then moves each new file into place. A file that another distribution owns with
different contents is a conflict: it is reported before anything moves, never resolved
silently. Standard library only (runs on the node).
"""

from __future__ import annotations

import csv
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from wheelhouse.batches import WheelhouseError
from wheelhouse.names import normalize

# pip's `--target` installs under a home scheme (purelib = <home>/lib/python) and then moves
# purelib and the data folders (`bin`, `include`, ...) up into the target: RECORD paths of the
# data folders therefore read `../../bin/ray` relative to the target's root.
_HOME_SCHEME_PREFIX = ("..", "..")


@dataclass(frozen=True)
class Distribution:
    """One installed distribution in a folder: its name, version and the files it owns."""

    project: str  # normalised name
    version: str
    info: str  # the `.dist-info` folder's name
    files: frozenset[str]  # '/'-separated, relative to the folder's root


def record_paths(root: Path, info: str) -> frozenset[str]:
    """The files a distribution's RECORD lists, relative to `root` (its own folder excluded)."""
    record = root / info / "RECORD"
    if not record.is_file():
        return frozenset()
    paths = set()
    with record.open(newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if not row:
                continue
            parts = PurePosixPath(row[0]).parts
            if parts[:2] == _HOME_SCHEME_PREFIX:
                parts = parts[2:]
            if not parts or ".." in parts or parts[0] == info:
                continue
            paths.add("/".join(parts))
    return frozenset(paths)


def installed(root: Path) -> dict[str, Distribution]:
    """The distributions installed in `root`, by normalised project name."""
    found = {}
    for info in sorted(root.glob("*.dist-info")):
        name, _, rest = info.name.removesuffix(".dist-info").partition("-")
        project = normalize(name)
        found[project] = Distribution(project, rest, info.name, record_paths(root, info.name))
    return found


def _files(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()
    )


def _same_bytes(a: Path, b: Path) -> bool:
    if a.is_symlink() or b.is_symlink():
        return a.is_symlink() and b.is_symlink() and a.readlink() == b.readlink()
    return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()


def conflicts(staging: Path, target: Path) -> list[str]:
    """Files of `staging` that a distribution in `target` (not being replaced) owns with other
    contents, each as `path (owner version vs newcomer version)`."""
    new = installed(staging)
    owners = {
        path: dist
        for dist in installed(target).values()
        if dist.project not in new
        for path in dist.files
    }
    newcomer = {path: dist for dist in new.values() for path in dist.files}
    found = []
    for rel in _files(staging):
        if "/__pycache__/" in f"/{rel}":
            continue  # byte-code caches differ by timestamp; their sources are compared
        owner = owners.get(rel)
        if owner is None or not (target / rel).exists():
            continue
        if _same_bytes(staging / rel, target / rel):
            continue  # e.g. one namespace `__init__.py` shipped by several distributions
        incoming = newcomer.get(rel)
        by = f"{incoming.project} {incoming.version}" if incoming else "this install"
        found.append(f"{rel} ({owner.project} {owner.version} vs {by})")
    return found


def _remove(target: Path, dist: Distribution) -> None:
    """Uninstall `dist` from `target`: its files, its metadata, folders left empty."""
    folders = set()
    for rel in dist.files:
        path = target / rel
        if path.is_file() or path.is_symlink():
            path.unlink()
            folders.update(path.parents)
    shutil.rmtree(target / dist.info, ignore_errors=True)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        inside = folder != target and target in folder.parents
        if inside and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def merge_into(staging: Path, target: Path) -> None:
    """Move everything pip installed in `staging` into `target`, file by file: a distribution
    already in `target` at any version is uninstalled first; a file another distribution owns
    with other contents stops the merge before anything moves."""
    clashes = conflicts(staging, target) if target.is_dir() else []
    if clashes:
        more = f" and {len(clashes) - 1} more" if len(clashes) > 1 else ""
        raise WheelhouseError(
            f"{target} already has {clashes[0]}{more}: two distributions own the same file; "
            "install these wheelhouses into separate --target folders"
        )
    target.mkdir(parents=True, exist_ok=True)
    old = installed(target)
    for project in installed(staging):
        if project in old:
            _remove(target, old[project])
    for rel in _files(staging):
        source, dest = staging / rel, target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        shutil.move(str(source), dest)
