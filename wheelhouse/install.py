"""On the node, offline: stash batches as they arrive, join split wheels, verify every wheel
against the manifest and install them all with pip. Standard library only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from wheelhouse.batches import MANIFEST, MANIFEST_FORMAT, WheelhouseError, sha256
from wheelhouse.names import normalize


def read_manifest(folders: list[Path]) -> dict:
    """The manifest carried in the given batch folders (they must agree)."""
    found = [f / MANIFEST for f in folders if (f / MANIFEST).is_file()]
    if not found:
        names = ", ".join(str(f) for f in folders)
        raise WheelhouseError(f"no {MANIFEST} in {names}: not a wheelhouse batch")
    texts = {p.read_text() for p in found}
    if len(texts) > 1:
        raise WheelhouseError("batches come from different builds (their manifests differ)")
    manifest = json.loads(texts.pop())
    if manifest.get("format") != MANIFEST_FORMAT:
        raise WheelhouseError(f"unknown manifest format {manifest.get('format')!r}")
    return manifest


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
    """Copy the batches' files (and manifest) into the stash folder."""
    into.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for path in sorted(folder.iterdir()):
            if path.is_file():
                shutil.copyfile(path, into / path.name)


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
        if path.stat().st_size != entry["size"] or sha256(path) != entry["sha256"]:
            raise WheelhouseError(f"checksum mismatch: {wheel} (damaged in transit? copy again)")
        wheels.append(path)
    return wheels


# Folders of a --target that several distributions write into (console scripts, headers,
# data): merged file by file, where pip's `--upgrade --target` would replace them whole.
SHARED_FOLDERS = frozenset({"bin", "include", "share", "etc"})


def pip_install(wheels: list[Path], target: Path | None, staging: Path) -> None:
    """`python -m pip install --no-index --no-deps` the wheels (and source distributions),
    into `target` or this environment.

    A target is filled through `staging`: pip installs there, then `merge_into` moves the
    result over, so a second wheelhouse installed into the same target keeps the first one's
    console scripts (pip's own `--upgrade --target` replaces the whole `bin` folder).
    """
    command = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet"]
    if any(not w.name.endswith(".whl") for w in wheels):
        # source distributions build with the node's own setuptools/torch: nothing to fetch
        command.append("--no-build-isolation")
    if target is not None:
        command += ["--target", str(staging)]
    command += [str(w) for w in wheels]
    if subprocess.run(command, check=False).returncode != 0:
        raise WheelhouseError(f"pip could not install the {len(wheels)} files (see above)")
    if target is not None:
        merge_into(staging, target)


def merge_into(staging: Path, target: Path) -> None:
    """Move what pip installed in `staging` into `target`: packages replace their older copies
    (metadata of another version included), shared folders (`SHARED_FOLDERS`) gain or replace
    single files."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in staging.iterdir():
        if entry.name.endswith(".dist-info"):  # an upgrade: the old version's metadata goes
            project = normalize(entry.name.split("-")[0])
            for old in target.glob("*.dist-info"):
                if normalize(old.name.split("-")[0]) == project:
                    shutil.rmtree(old)
        dest = target / entry.name
        if entry.name in SHARED_FOLDERS and entry.is_dir() and dest.is_dir():
            for item in entry.rglob("*"):
                if item.is_file() or item.is_symlink():
                    placed = dest / item.relative_to(entry)
                    placed.parent.mkdir(parents=True, exist_ok=True)
                    placed.unlink(missing_ok=True)
                    shutil.move(str(item), placed)
            continue
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        shutil.move(str(entry), dest)


def install(folders: list[Path], target: Path | None, stash_dir: Path | None) -> str:
    """Install the batches; with a stash, first add them to it and install once it is complete.

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
        pip_install(wheels, target, work / "staging")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    where = str(target) if target is not None else sys.prefix
    return f"installed {len(wheels)} wheels into {where}"
