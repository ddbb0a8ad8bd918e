"""Build a wheelhouse for a node: download its wheels (resolved or as given), leave out what it
has, slim kernel wheels and pack everything into batches."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from wheelhouse import resolve, sdists
from wheelhouse.batches import WheelhouseError, batch_summary, write_batches
from wheelhouse.names import normalize, wheel_name_version
from wheelhouse.profiles import Rule, rules_for
from wheelhouse.slim import slim_wheel
from wheelhouse.target import Target

# resolves that prefer the node's versions, each pinning what the one before replaced
PREFER_NODE_ROUNDS = 3


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
    sdists: dict[str, str] = field(default_factory=dict)
    index_url: str | None = None
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    @property
    def pip_options(self) -> list[str]:
        options = [f"--find-links={f}" for f in self.find_links]
        if self.index_url:
            options.append(f"--index-url={self.index_url}")
        if self.no_index:
            options.append("--no-index")
        return options


@dataclass
class Plan:
    """What to fetch: exact wheel requirements and (name, version) source distributions."""

    wheels: list[str] = field(default_factory=list)
    sdists: list[tuple[str, str]] = field(default_factory=list)


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


def plan_no_deps(request: BuildRequest, log: list[str]) -> Plan:
    plan = Plan()
    for text in request.requirements:
        pin = sdists.exact_pin(text)
        if pin and request.target.has(*pin):
            log.append(f"node has {text}")
        elif pin and pin[0] in request.sdists:
            plan.sdists.append(pin)
        else:
            plan.wheels.append(text)
    return plan


def needed_items(
    report: dict, keep: set[str], target: Target
) -> tuple[list[resolve.Resolved], list[resolve.Resolved]]:
    """(everything resolved, what the node needs of it)."""
    items = resolve.parse_report(report)
    return items, resolve.needed(items, keep, resolve.marker_environment(report, target))


def plan_resolved(request: BuildRequest, log: list[str]) -> Plan:
    """Resolve for the node; where the newest versions replace ones the node has, resolve again
    with the node's versions pinned, all of them where that resolves, else all but the ones
    that conflict with the requirements (`resolve.split_pins`), which are named."""
    target = request.target
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
        stand_ins = Path(tmp) / "stand-ins"
        for name, version in request.sdists.items():
            sdists.write_stand_in(stand_ins, name, version)
        options = request.pip_options + ([f"--find-links={stand_ins}"] if request.sdists else [])
        constraints = [pins, *request.constraints]
        keep = {normalize(k) for k in request.keep}
        report = resolve.run_report(target, request.requirements, constraints, options)
        items, wanted = needed_items(report, keep, target)
        prefer = Path(tmp) / "node-versions.txt"

        def resolves(node_versions: list[str]) -> dict | None:
            prefer.write_text("".join(f"{line}\n" for line in node_versions))
            return resolve.try_report(target, request.requirements, [*constraints, prefer], options)

        node_pins: list[str] = []
        conflicting: list[str] = []
        for _ in range(PREFER_NODE_ROUNDS):  # a kept version can bring in other dependencies
            more = [
                pin for pin in resolve.node_constraints(target, wanted) if pin not in conflicting
            ]
            if not more:
                break
            kept, taken, refused = resolve.split_pins(resolves, node_pins, more)
            conflicting += refused
            if kept is None:
                break
            node_pins += taken
            items, wanted = needed_items(kept, keep, target)
        if conflicting:
            log.append(
                "the requirements need other versions than the node's of: "
                + ", ".join(line.partition("==")[0] for line in conflicting)
                + (" (the node's versions of the others are kept)" if node_pins else "")
            )
    skipped = {i.name for i in items} - {w.name for w in wanted}
    if skipped:
        log.append(
            f"node has (kept, or only needed by {', '.join(sorted(keep))}): "
            + ", ".join(sorted(skipped))
        )
    plan = Plan()
    for item in wanted:
        if target.has(item.name, item.version):
            log.append(f"node has {item.name}=={item.version}")
        elif item.name in request.sdists:
            plan.sdists.append((item.name, item.version))
        else:
            plan.wheels.append(f"{item.name}=={item.version}")
    return plan


def build(request: BuildRequest) -> list[str]:
    """Build the wheelhouse under `request.out`; returns the lines to print."""
    log: list[str] = []
    plan = plan_no_deps(request, log) if request.no_deps else plan_resolved(request, log)
    target = request.target
    rules = rules_for(list(request.slim))
    notes: dict[str, dict] = {}
    files: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        download, slimmed = Path(tmp) / "download", Path(tmp) / "slim"
        download.mkdir()
        slimmed.mkdir()
        if plan.wheels:
            pip_download(target, plan.wheels, download, request.pip_options)
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
            files.append(path)
        index = None if request.no_index else (request.index_url or sdists.PYPI)
        for name, version in plan.sdists:
            path = sdists.fetch(name, version, download, index, list(request.find_links))
            notes[path.name] = {"sdist": True}
            log.append(f"{path.name}: source distribution, built by pip on the node")
            files.append(path)
        if not files:
            raise WheelhouseError("the node already has everything requested: nothing to build")
        request.out.mkdir(parents=True, exist_ok=True)
        manifest = write_batches(files, request.out, request.batch_mib, notes)
    return [*log, *batch_summary(manifest)]
