"""On the node, offline: stash batches as they arrive, join split wheels, verify every wheel
against the manifest and install them all with pip. Standard library (and `common`) only."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from common.digests import file_sha256
from common.owned_files import NotPrivate, owned_dir, write_atomic
from wheelhouse.batches import MANIFEST, MANIFEST_FORMAT, WheelhouseError
from wheelhouse.merge import merge_into


def read_manifest(folders: list[Path]) -> dict:
    """The manifest carried in the given batch folders (they must agree), checked for shape and
    for file names that could point outside the folder it is installed from."""
    found = [f / MANIFEST for f in folders if (f / MANIFEST).is_file()]
    if not found:
        names = ", ".join(str(f) for f in folders)
        raise WheelhouseError(f"no {MANIFEST} in {names}: not a wheelhouse batch")
    manifests = {}
    for path in found:
        manifest = _parse_manifest(path)
        manifests[json.dumps(manifest, sort_keys=True)] = manifest
    if len(manifests) > 1:
        raise WheelhouseError("batches come from different builds (their manifests differ)")
    return manifests.popitem()[1]


def _parse_manifest(path: Path) -> dict:
    """One manifest file, or one line naming what is wrong with it."""
    damaged = f"damaged manifest {path} (copy that batch again)"
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise WheelhouseError(f"{damaged}: not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise WheelhouseError(f"unknown manifest format {found!r} in {path}")
    problem = _manifest_problem(manifest)
    if problem:
        raise WheelhouseError(f"{damaged}: {problem}")
    return manifest


def _manifest_problem(manifest: dict) -> str | None:
    """What makes a parsed manifest unusable, or None."""
    batches, wheels = manifest.get("batches"), manifest.get("wheels")
    if not isinstance(batches, int) or not isinstance(wheels, dict):
        return "no batch count or wheel list"
    numbers = range(1, batches + 1)
    for name, entry in wheels.items():
        if not _plain_file_name(name):
            return f"{name!r} is not a plain file name"
        if not isinstance(entry, dict) or not isinstance(entry.get("parts"), list):
            return f"no entry for {name}"
        if not isinstance(entry.get("sha256"), str) or not isinstance(entry.get("size"), int):
            return f"no checksum or size for {name}"
        if entry.get("batch") is None and not entry["parts"]:
            return f"{name} is in no batch"
        if entry.get("batch") is not None and entry.get("batch") not in numbers:
            return f"{name} is in batch {entry.get('batch')!r} of {batches}"
        for part in entry["parts"]:
            if not isinstance(part, dict) or not _plain_file_name(part.get("file")):
                return f"a part of {name} has no plain file name"
            if part.get("batch") not in numbers or not isinstance(part.get("size"), int):
                return f"part {part['file']} has no batch or size"
    return None


def _plain_file_name(name: object) -> bool:
    """A name that stays inside the folder it is joined to: no separators, `.` or `..`."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
    )


def expected_files(manifest: dict) -> dict[str, int]:
    """Every file the build wrote, mapped to its batch number."""
    files: dict[str, int] = {}
    for wheel, entry in manifest["wheels"].items():
        if entry["batch"] is not None:
            files[wheel] = entry["batch"]
        for part in entry["parts"]:
            files[part["file"]] = part["batch"]
    return files


def missing_batches(manifest: dict, present: set[str]) -> list[int]:
    """Batches with at least one file not in `present`."""
    return sorted({b for f, b in expected_files(manifest).items() if f not in present})


def check_complete(manifest: dict, present: set[str]) -> None:
    """One line naming what is missing: whole batches, or single files of a batch that came."""
    files = expected_files(manifest)
    absent = {f: b for f, b in files.items() if f not in present}
    if not absent:
        return
    whole = sorted(
        {b for b in absent.values() if all(absent.get(f) == b for f, n in files.items() if n == b)}
    )
    if whole:
        names = ", ".join(f"batch-{b}" for b in whole)
        raise WheelhouseError(f"missing {names} (of {manifest['batches']}): copy it here first")
    name, number = sorted(absent.items())[0]
    raise WheelhouseError(f"missing {name} from batch-{number}: copy that batch again")


def stash(folders: list[Path], into: Path) -> None:
    """Copy the batches' files (and manifest) into the stash folder, which only this user may
    change. A symlink in a batch could name any file of the node: refused. A file is written
    beside its place in the stash and renamed over it, never through a symlink there."""
    try:
        owned_dir(into)
    except NotPrivate as err:
        raise WheelhouseError(f"--stash {into}: {err}") from None
    for folder in folders:
        for path in sorted(folder.iterdir()):
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise WheelhouseError(f"{path} is a symlink; a batch holds files only")
            if stat.S_ISREG(mode):
                write_atomic(into / path.name, path.read_bytes())


def assemble(manifest: dict, folders: list[Path], work: Path) -> list[Path]:
    """Every wheel of the manifest, whole and checked: split ones joined into `work`."""
    where = {p.name: p for f in folders for p in f.iterdir() if p.is_file()}
    check_complete(manifest, set(where))
    work.mkdir(parents=True, exist_ok=True)
    wheels = []
    for wheel, entry in sorted(manifest["wheels"].items()):
        if entry["parts"]:
            path = work / wheel
            with path.open("wb") as out:
                for part in entry["parts"]:
                    out.write(where[part["file"]].read_bytes())
        else:
            path = where[wheel]
        if path.stat().st_size != entry["size"] or file_sha256(path) != entry["sha256"]:
            raise WheelhouseError(f"checksum mismatch: {wheel} (damaged in transit? copy again)")
        wheels.append(path)
    return wheels


def pip_install(files: list[Path], target: Path | None, work: Path) -> list[Path]:
    """`python -m pip install --no-index --no-deps` the wheels, then wheels built from the
    source distributions, into `target` or this environment; returns the wheels built.

    Source distributions build last (`pip wheel --no-build-isolation`, into `work`): against
    the node's own torch, setuptools and compilers and against the wheels just installed
    (Transformer Engine's PyTorch extension builds against its core wheel). A target is filled
    through a staging folder and `merge.merge_into`, file by file, so wheelhouses installed
    one after another into one target keep each other's files.
    """
    wheels = [f for f in files if f.name.endswith(".whl")]
    sources = [f for f in files if not f.name.endswith(".whl")]
    _install_wheels(wheels, target, work / "staging")
    if not sources:
        return []
    built = work / "built"
    command = [sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "--quiet"]
    command += ["--no-build-isolation", "--wheel-dir", str(built), *map(str, sources)]
    if subprocess.run(command, check=False, env=_with_target(target)).returncode != 0:
        raise WheelhouseError(
            f"pip could not build the {len(sources)} source distributions (see above)"
        )
    made = sorted(built.glob("*.whl"))
    _install_wheels(made, target, work / "staging")
    return made


def _with_target(target: Path | None) -> dict[str, str] | None:
    """The environment that puts `target` first on the import path, or None (inherit)."""
    if target is None:
        return None
    paths = [str(target), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _install_wheels(wheels: list[Path], target: Path | None, staging: Path) -> None:
    if not wheels:
        return
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    if target is not None:
        command += ["--target", str(staging)]
    command += [str(f) for f in wheels]
    if subprocess.run(command, check=False, env=_with_target(target)).returncode != 0:
        raise WheelhouseError(f"pip could not install the {len(wheels)} wheels (see above)")
    if target is not None:
        merge_into(staging, target)
        shutil.rmtree(staging, ignore_errors=True)


def install(
    folders: list[Path],
    target: Path | None,
    stash_dir: Path | None,
    keep_built: Path | None = None,
) -> str:
    """Install the batches; with a stash, first add them to it and install once it is complete.
    With `keep_built`, the wheels built there from source distributions are copied into that
    folder: carried back, they replace the sdists in the next build (`--find-links`), for nodes
    with the same Python, torch and CUDA.

    Returns the line to print.
    """
    for folder in folders:
        if not folder.is_dir():
            raise WheelhouseError(f"no such batch folder: {folder}")
    if stash_dir is not None:
        manifest = read_manifest(folders)
        stash(folders, stash_dir)
        waiting = missing_batches(manifest, {p.name for p in stash_dir.iterdir()})
        if waiting:
            names = ", ".join(f"batch-{b}" for b in waiting)
            return f"stashed in {stash_dir}; waiting for {names} (of {manifest['batches']})"
        folders = [stash_dir]
    manifest = read_manifest(folders)
    work = Path(tempfile.mkdtemp(prefix="wheelhouse-"))
    try:
        wheels = assemble(manifest, folders, work)
        built = pip_install(wheels, target, work)
        kept: list[Path] = []
        if keep_built is not None and built:
            keep_built.mkdir(parents=True, exist_ok=True)
            kept = [Path(shutil.copy2(wheel, keep_built / wheel.name)) for wheel in built]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = str(target) if target is not None else sys.prefix
    line = f"installed {len(wheels)} wheels into {where}"
    if kept:
        line += f"; {', '.join(w.name for w in kept)} built from source, kept in {keep_built}"
    return line
