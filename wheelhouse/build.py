"""Build a wheelhouse for a node: download its wheels (resolved or as given), leave out what it
has, slim kernel wheels and pack everything into batches."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from wheelhouse import resolve
from wheelhouse.batches import WheelhouseError, batch_summary, write_batches
from wheelhouse.names import normalize, wheel_name_version
from wheelhouse.profiles import Rule, rules_for
from wheelhouse.slim import slim_wheel
from wheelhouse.target import Target


@dataclass(frozen=True)
class BuildRequest:
    target: Target
    requirements: list[str]
    constraints: list[Path]
    out: Path
    batch_mib: float = 60
    no_deps: bool = False
    keep: tuple[str, ...] = ("torch",)
    slim: tuple[str, ...] = ()
    cuda_arch: int | None = None
    pip_options: tuple[str, ...] = ()


def read_requirements(positional: list[str], files: list[Path]) -> list[str]:
    """Requirement strings from the command line and `-r` files (comments and blanks skipped)."""
    found = list(positional)
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError as err:
            raise WheelhouseError(f"cannot read {path}: {err.strerror}") from None
        found += [ln.split("#", 1)[0].strip() for ln in lines]
    found = [r for r in found if r]
    for text in found:
        try:
            Requirement(text)
        except InvalidRequirement as err:
            raise WheelhouseError(f"bad requirement {text!r}: {str(err).splitlines()[0]}") from None
    if not found:
        raise WheelhouseError("no requirements given (positional or -r FILE)")
    return found


def pip_download(target: Target, specs: list[str], into: Path, options: list[str]) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into)]
    command += target.pip_args() + options + specs
    if subprocess.run(command, check=False).returncode != 0:
        raise WheelhouseError("pip could not download the wheels for the node (see above)")


def already_there(target: Target, requirement: str) -> bool:
    """An exact pin (`name==version`) the node already satisfies."""
    req = Requirement(requirement)
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    return len(pins) == 1 and "*" not in pins[0] and target.has(req.name, pins[0])


def plan_specs(request: BuildRequest, log: list[str]) -> list[str]:
    """The exact requirements to download (`name==version` in resolve mode)."""
    target = request.target
    if request.no_deps:
        keep = [r for r in request.requirements if not already_there(target, r)]
        log += [f"node has {r}" for r in request.requirements if r not in keep]
        return keep
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != target.python_version:
        log.append(
            f"warning: pip evaluates environment markers for this Python ({here}), not the "
            f"node's ({target.python_version}): run `build` with Python {target.python_version} "
            "for an exact closure"
        )
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        pins = Path(tmp) / "keep.txt"
        pins.write_text(
            "".join(f"{line}\n" for line in resolve.keep_constraints(target, list(request.keep)))
        )
        report = resolve.run_report(
            target, request.requirements, [pins, *request.constraints], list(request.pip_options)
        )
    items = resolve.parse_report(report)
    keep = {normalize(k) for k in request.keep}
    wanted = resolve.needed(items, keep, resolve.marker_environment(report, target))
    skipped = {i.name for i in items} - {w.name for w in wanted}
    if skipped:
        log.append(
            f"node has (kept, or only needed by {', '.join(sorted(keep))}): "
            + ", ".join(sorted(skipped))
        )
    specs = []
    for item in wanted:
        if target.has(item.name, item.version):
            log.append(f"node has {item.name}=={item.version}")
        else:
            specs.append(f"{item.name}=={item.version}")
    return specs


def build(request: BuildRequest) -> list[str]:
    """Build the wheelhouse under `request.out`; returns the lines to print."""
    log: list[str] = []
    specs = plan_specs(request, log)
    if not specs:
        raise WheelhouseError("the node already has everything requested: nothing to build")
    target = request.target
    rules = rules_for(list(request.slim))
    notes: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        download, slimmed = Path(tmp) / "download", Path(tmp) / "slim"
        download.mkdir()
        slimmed.mkdir()
        pip_download(target, specs, download, list(request.pip_options))
        wheels = []
        for path in sorted(download.glob("*.whl")):
            name, version = wheel_name_version(path.name)
            if target.has(name, version):
                log.append(f"node has {name}=={version}")
                continue
            note: dict = {}
            if name in target.have:
                note["replaces"] = f"{name} {target.have[name]}"
                log.append(f"{path.name} replaces node's {name} {target.have[name]}")
            rule = rules.get(name)
            if rule is not None or request.cuda_arch is not None:
                result = slim_wheel(path, slimmed / path.name, rule or Rule(), request.cuda_arch)
                if result is not None:
                    note["slimmed"] = {"profiles": list(request.slim), "from_size": result.before}
                    log.append(result.line(path.name))
                    path = slimmed / path.name
            notes[path.name] = note
            wheels.append(path)
        if not wheels:
            raise WheelhouseError("the node already has everything requested: nothing to build")
        request.out.mkdir(parents=True, exist_ok=True)
        manifest = write_batches(wheels, request.out, request.batch_mib, notes)
    return [*log, *batch_summary(manifest)]
