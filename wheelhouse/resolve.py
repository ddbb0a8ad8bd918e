"""Resolve a dependency closure for the node with pip's resolver, keeping the node's own torch.

`pip install --dry-run --ignore-installed --report` (pip's stable JSON install report) runs for
the node's Python and platform, with the node's `--keep` packages pinned to their public
versions. What only those packages need (CUDA runtime wheels, triton, ...) the node already has
under its own pins, so it is left out of the download. pip prefers the newest version of
everything else; where that replaces a version the node has, `node_constraints` pins the node's
for a second resolve. Where pinning all of them fails, `split_pins` finds the ones that really
conflict (pinning the rest), so that only those are replaced.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement

from wheelhouse.batches import WheelhouseError
from wheelhouse.names import normalize, public_version
from wheelhouse.target import Target


@dataclass(frozen=True)
class Resolved:
    name: str
    version: str
    requested: bool
    requires: tuple[str, ...]
    extras: tuple[str, ...]


def keep_constraints(target: Target, keep: list[str]) -> list[str]:
    """`name==public-version` for each kept package the node has (local part stripped)."""
    lines = []
    for name in sorted({normalize(k) for k in keep}):
        version = target.have.get(name)
        if version is not None:
            lines.append(f"{name}=={public_version(version)}")
    return lines


def node_constraints(target: Target, items: list[Resolved]) -> list[str]:
    """`name==node-version` for each resolved package the node has in another version and no
    requirement names itself: a second resolve under these keeps the node's own versions
    wherever they satisfy every requirement (pip itself prefers the newest)."""
    return [
        f"{item.name}=={public_version(target.have[item.name])}"
        for item in items
        if item.name in target.have
        and not item.requested
        and not target.has(item.name, item.version)
    ]


def split_pins(
    resolves: Callable[[list[str]], dict | None], pinned: list[str], candidates: list[str]
) -> tuple[dict | None, list[str], list[str]]:
    """Split `candidates` (``name==version`` pins) into those that resolve together with
    `pinned` and those that conflict: all at once when they resolve, else each half in turn,
    down to single pins. A pin conflicts when it does not resolve with `pinned` and the pins
    taken before it. `resolves(pins)` is a resolve's report, or None where it fails.

    Returns (the report of the last resolve that succeeded, or None where no pin was taken;
    the pins taken; the conflicting pins). k conflicts among n pins take at most
    1 + 2 k log2(n) resolves: one when none conflicts.
    """
    report: dict | None = None
    taken: list[str] = []
    conflicting: list[str] = []

    def visit(group: list[str], known_to_fail: bool) -> None:
        nonlocal report
        if not known_to_fail and (attempt := resolves([*pinned, *taken, *group])) is not None:
            report = attempt
            taken.extend(group)
            return
        if len(group) == 1:
            conflicting.extend(group)
            return
        half = len(group) // 2
        before = len(taken)
        visit(group[:half], known_to_fail=False)
        # All of the first half taken: the second half is the set that just failed.
        visit(group[half:], known_to_fail=len(taken) - before == half)

    if candidates:
        visit(list(candidates), known_to_fail=False)
    return report, taken, conflicting


def run_report(
    target: Target, requirements: list[str], constraints: list[Path], pip_options: list[str]
) -> dict:
    """pip's JSON install report of resolving `requirements` for the target node."""
    report = try_report(target, requirements, constraints, pip_options, quiet=False)
    if report is None:
        raise WheelhouseError("pip could not resolve the requirements for the node (see above)")
    return report


def try_report(
    target: Target,
    requirements: list[str],
    constraints: list[Path],
    pip_options: list[str],
    *,
    quiet: bool = True,
) -> dict | None:
    """`run_report`, or None where pip cannot resolve (its messages shown unless `quiet`)."""
    with tempfile.TemporaryDirectory(prefix="wheelhouse-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
        command += ["--quiet", "--report", str(report), "--target", str(Path(tmp) / "site")]
        command += target.pip_args() + pip_options
        for path in constraints:
            command += ["-c", str(path)]
        command += requirements
        if subprocess.run(command, check=False, capture_output=quiet).returncode != 0:
            return None
        return json.loads(report.read_text())


def parse_report(report: dict) -> list[Resolved]:
    items = []
    for item in report.get("install", []):
        meta = item["metadata"]
        items.append(
            Resolved(
                name=normalize(meta["name"]),
                version=meta["version"],
                requested=bool(item.get("requested")),
                requires=tuple(meta.get("requires_dist") or ()),
                extras=tuple(item.get("requested_extras") or ()),
            )
        )
    return items


def marker_environment(report: dict, target: Target) -> dict[str, str]:
    """The report's marker environment, with the node's Python version."""
    env = dict(report.get("environment") or {})
    env["python_version"] = target.python_version
    full = env.get("python_full_version", "")
    if not full.startswith(target.python_version + "."):
        env["python_full_version"] = target.python_version + ".0"
    return env


def needed(items: list[Resolved], keep: set[str], env: dict[str, str]) -> list[Resolved]:
    """The resolved packages reachable from the requested ones without passing through a kept
    package (those the node has, with everything only they require)."""
    by_name = {i.name: i for i in items}
    active: dict[str, set[str]] = {}
    queue = [(i.name, set(i.extras)) for i in items if i.requested and i.name not in keep]
    while queue:
        name, extras = queue.pop()
        seen = active.get(name)
        if seen is not None and extras <= seen:
            continue
        active[name] = (seen or set()) | extras
        for text in by_name[name].requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            dep = normalize(req.name)
            if dep not in by_name or dep in keep:
                continue
            if req.marker is None or _any_extra(req.marker, env, active[name]):
                queue.append((dep, set(req.extras)))
    return [by_name[n] for n in sorted(active)]


def _any_extra(marker: Marker, env: dict[str, str], extras: set[str]) -> bool:
    return any(marker.evaluate(env | {"extra": e}) for e in {"", *extras})
