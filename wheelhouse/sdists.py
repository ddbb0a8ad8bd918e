"""Source distributions carried as they are: packages published without wheels (some compile
against the node's own torch and CUDA), which pip builds on the node.

pip cannot download them without building their metadata (which needs that torch and nvcc), so
they are fetched from the index's JSON API (PEP 691) with their sha256 checked, or taken from a
`--find-links` folder. For pip's binary-only resolver they are stood in for by metadata-only
wheels that declare no dependencies.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from common.digests import file_sha256
from wheelhouse.batches import WheelhouseError
from wheelhouse.names import normalize
from wheelhouse.target import same_public_version
from wheelhouse.wheel_file import write_wheel

PYPI = "https://pypi.org/simple"
SUFFIXES = (".tar.gz", ".zip")


def exact_pin(requirement: str) -> tuple[str, str] | None:
    """(normalised name, version) of an exact pin `name==version`, else None."""
    req = Requirement(requirement)
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    if len(pins) != 1 or "*" in pins[0]:
        return None
    return normalize(req.name), pins[0]


def parse_pin(text: str) -> tuple[str, str]:
    """`NAME==VERSION` -> (normalised name, version)."""
    try:
        pin = exact_pin(text)
    except InvalidRequirement:
        pin = None
    if pin is None:
        raise WheelhouseError(f"--sdist {text!r}: expected NAME==VERSION")
    return pin


def is_sdist(filename: str, name: str, version: str) -> bool:
    """Whether `filename` is the source distribution of name==version."""
    for suffix in SUFFIXES:
        if filename.endswith(suffix):
            dist, sep, ver = filename[: -len(suffix)].rpartition("-")
            return bool(sep) and normalize(dist) == name and same_public_version(ver, version)
    return False


def fetch(
    name: str, version: str, into: Path, index_url: str | None, find_links: list[str]
) -> Path:
    """The sdist of name==version, copied from a find-links folder or downloaded and checked."""
    for folder in find_links:
        for path in sorted(Path(folder).glob("*")):
            if is_sdist(path.name, name, version):
                target = into / path.name
                target.write_bytes(path.read_bytes())
                return target
    if index_url is None:
        raise WheelhouseError(f"no source distribution of {name}=={version} in --find-links")
    page = f"{index_url.rstrip('/')}/{name}/"
    request = urllib.request.Request(
        page, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
        found = [f for f in files if is_sdist(f["filename"], name, version)]
        if not found:
            raise WheelhouseError(f"{page} has no source distribution of {name}=={version}")
        entry = found[0]
        target = into / entry["filename"]
        with urllib.request.urlopen(urllib.parse.urljoin(page, entry["url"]), timeout=300) as r:
            target.write_bytes(r.read())
    except (OSError, ValueError, KeyError) as err:
        raise WheelhouseError(f"cannot fetch the sdist of {name}=={version}: {err}") from None
    expected = entry.get("hashes", {}).get("sha256")
    if expected and file_sha256(target) != expected:
        raise WheelhouseError(f"checksum mismatch: {entry['filename']} from {page}")
    return target


def write_stand_in(folder: Path, name: str, version: str) -> Path:
    """A metadata-only wheel of name==version (no dependencies) for pip's resolver."""
    return write_wheel(folder, name, version, {})
