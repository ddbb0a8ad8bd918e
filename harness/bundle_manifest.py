"""A bundle's manifest: what a launch's `prepare` makes (its inputs), every file of them with its
size and sha256, and the check of a bundle against it. No Hub, no launch: `harness.bundle`
makes bundles, `harness.bundle_launch` launches from one, `harness.live` runs its check.

A bundle's folders are a launch's ``--model-dir`` and ``--data-dir`` (``DIR/models``,
``DIR/datasets``); ``DIR/manifest.json`` names each input (a Hub repository, or the command
that built it), the folders that hold it, and every file in them. The manifest is data carried
from elsewhere: a path in it that leaves the bundle, or a form other than `write_manifest`'s, is
refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.digests import file_sha256
from common.owned_files import write_atomic
from harness.steps import HubDownload, Shell, Step

MANIFEST = "manifest.json"
FORMAT = 1
PLACEHOLDER = "<bundle>"  # the bundle's own path in a recorded command
HUB_STATE = ".cache"  # huggingface_hub's resume state inside a download's folder: not carried
PROG = "python -m harness.bundle"  # makes and checks bundles
MODELS, DATASETS = "models", "datasets"  # a bundle's --model-dir and --data-dir


def bundle_dirs(bundle: str) -> dict[str, str]:
    """The launch's ``--model-dir`` and ``--data-dir`` in the bundle at `bundle`."""
    return {"model_dir": f"{bundle}/{MODELS}", "data_dir": f"{bundle}/{DATASETS}"}


class BundleError(Exception):
    """A bundle that cannot be made or used (one line)."""


@dataclass(frozen=True)
class Item:
    """One input of the launch: where it comes from (`source`: a Hub repository, or the command
    that builds it) and the bundle's folders that hold it (`dirs`, relative)."""

    source: dict[str, Any]
    dirs: tuple[str, ...]

    @property
    def key(self) -> str:
        """The source without its revision: what a launch expects (it cannot know the commit)."""
        return json.dumps({k: v for k, v in self.source.items() if k != "revision"}, sort_keys=True)


def items_of(steps: Iterable[Step], root: str) -> list[Item]:
    """The inputs `prepare`'s `steps` make inside the bundle at `root`."""
    items = []
    for step in steps:
        if isinstance(step, HubDownload):
            source = {"kind": "hub", "repo_id": step.repo_id, "repo_type": step.repo_type}
            items.append(Item({**source, "patterns": list(step.allow_patterns)}, (step.local_dir,)))
        elif isinstance(step, Shell):
            command = [_placeheld(token, root) for token in step.argv]
            inside = tuple(token for token in step.argv if _inside(token, root))
            items.append(Item({"kind": "built", "command": command}, inside))
        else:
            raise BundleError(
                f"prepare emits a {step.kind} step; a bundle holds downloads and builds"
            )
    for item in items:
        if not item.dirs or not all(_inside(folder, root) for folder in item.dirs):
            raise BundleError(f"prepare writes {item.source} outside {root}")
    return [Item(item.source, tuple(_relative(d, root) for d in item.dirs)) for item in items]


def _inside(path: str, root: str) -> bool:
    return path.startswith(root.rstrip("/") + "/")


def _relative(path: str, root: str) -> str:
    return path[len(root.rstrip("/")) + 1 :]


def _placeheld(token: str, root: str) -> str:
    return PLACEHOLDER + token[len(root.rstrip("/")) :] if _inside(token, root) else token


def files_under(root: Path, folder: str) -> list[str]:
    """Every file under `root`/`folder` (relative to `root`, sorted), huggingface_hub's resume
    state left out; a link is refused: a bundle carries files."""
    found = []
    top = root / folder
    if top.is_file() and not top.is_symlink():
        return [folder]
    for current, dirs, files in os.walk(top):
        here = Path(current)
        if here == top and HUB_STATE in dirs:
            dirs.remove(HUB_STATE)
        for name in [*dirs, *files]:
            if (here / name).is_symlink():
                raise BundleError(f"{(here / name).relative_to(root)} is a link, not a file")
        found += [(here / name).relative_to(root).as_posix() for name in files]
    return sorted(found)


def write_manifest(root: Path, launcher: str, items: Sequence[Item]) -> dict[str, Any]:
    """Hash every file of `items` and write the manifest (atomically: the bundle's last file)."""
    entries = []
    for item in items:
        files = []
        for folder in item.dirs:
            if not (paths := files_under(root, folder)):
                raise BundleError(f"prepare made nothing in {root / folder}")
            files += [_entry(root, path) for path in paths]
        entries.append({"source": item.source, "dirs": list(item.dirs), "files": files})
    manifest = {"format": FORMAT, "launcher": launcher, "items": entries}
    write_atomic(root / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def _entry(root: Path, path: str) -> dict[str, Any]:
    return {"path": path, "size": (root / path).stat().st_size, "sha256": file_sha256(root / path)}


def read_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the bundle at `root`, as `write_manifest` writes it and naming no path
    outside the bundle (a manifest is data carried from elsewhere)."""
    path = root / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(
            f"{root} has no {MANIFEST}: not a bundle, or one whose making did not finish "
            f"(`{PROG} make` writes it last; run again, it resumes)"
        ) from None
    except (OSError, ValueError) as err:
        raise BundleError(f"{path} is unreadable ({err})") from None
    malformed = BundleError(f"{path} is not a bundle manifest of format {FORMAT}")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise malformed
    try:
        named = [name for item in manifest["items"] for name in _named(item)]
    except (KeyError, TypeError):
        raise malformed from None
    if not isinstance(manifest["items"], list) or not isinstance(manifest.get("launcher"), str):
        raise malformed
    for name in named:
        parts = name.split("/")
        if name.startswith("/") or "\\" in name or {"", ".", ".."} & set(parts):
            raise BundleError(f"{path} names {name!r}, a path outside the bundle")
    return manifest


def _named(item: dict[str, Any]) -> list[str]:
    """The folders and files an item of a manifest names; `KeyError` or `TypeError` when the
    item is not as `write_manifest` writes it."""
    if not isinstance(item["source"], dict):
        raise TypeError(item["source"])
    for entry in item["files"]:
        if not isinstance(entry["size"], int) or not isinstance(entry["sha256"], str):
            raise TypeError(entry)
    names = [*item["dirs"], *(entry["path"] for entry in item["files"])]
    if not all(isinstance(name, str) for name in names):
        raise TypeError(names)
    return names


def verify(root: str | Path, *, hashes: bool = True) -> dict[str, Any]:
    """The manifest of the bundle at `root`, after checking that every file it lists is there
    with its size and (with `hashes`) its sha256, and that its folders hold no other file.
    Raises `BundleError` naming the first problem and what to do."""
    root = Path(root)
    manifest = read_manifest(root)
    again = f"carry it again, or make the bundle again ({PROG} make {manifest['launcher']} {root})"
    for item in manifest["items"]:
        listed = {entry["path"] for entry in item["files"]}
        for entry in item["files"]:
            path = root / entry["path"]
            if not path.is_file() or path.is_symlink():
                raise BundleError(f"bundle {root}: {entry['path']} is missing; {again}")
            if (size := path.stat().st_size) != entry["size"]:
                raise BundleError(
                    f"bundle {root}: {entry['path']} is damaged ({size} bytes, the manifest "
                    f"says {entry['size']}); {again}"
                )
            if hashes and file_sha256(path) != entry["sha256"]:
                raise BundleError(
                    f"bundle {root}: {entry['path']} is damaged (its sha256 is not the "
                    f"manifest's); {again}"
                )
        for folder in item["dirs"]:
            if extra := next((p for p in files_under(root, folder) if p not in listed), None):
                raise BundleError(f"bundle {root}: {extra} is not in its manifest; remove it")
    return manifest


def file_count(manifest: dict[str, Any]) -> int:
    return sum(len(item["files"]) for item in manifest["items"])


def check_holds(manifest: dict[str, Any], expected: Sequence[Item]) -> None:
    """The bundle holds every input this launch's `prepare` makes (a bundle of another seed,
    or without the eval set this launch reads, is refused). Not the launcher it was made
    with: the twins of a recipe (CUDA, ROCm) read the same inputs."""
    held = {Item(entry["source"], tuple(entry["dirs"])).key for entry in manifest["items"]}
    for item in expected:
        if item.key not in held:
            raise BundleError(
                f"the bundle holds no {_describe(item.source)}, which this launch's prepare "
                f"makes (into {', '.join(item.dirs)}); make a bundle with the launch's settings"
            )


def _describe(source: dict[str, Any]) -> str:
    if source["kind"] == "hub":
        return f"{source['repo_type']} {source['repo_id']}"
    return f"output of `{' '.join(source['command'])}`"
