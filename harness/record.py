"""Recordings: a plan as canonical text (the snapshot format) and as structured steps.

`record(launcher, entrypoint)` records hermetically (record host, recorded hardware);
``python -m harness.record [--format json] [MODULE ...]`` prints the recordings of every
discovered launcher, for tools that compare two checkouts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.secrets import scrub, scrub_data
from harness import pinned_sets
from harness.context import Plan, build_plan
from harness.launcher import Launcher, LauncherArgs
from harness.steps import Step, train_py_argv
from trainer.config.flags import option


@dataclass(frozen=True)
class Recording:
    launcher: str
    name: str  # the entrypoint's name, or the name of a recording with options
    hardware: str
    steps: tuple[Step, ...]
    text: str
    step_dicts: tuple[dict[str, Any], ...] = field(repr=False)  # structured, secrets scrubbed

    @property
    def snapshot_name(self) -> str:
        """``launchers/amd/run_qwen3_4b_lora/train``: where its snapshot lives."""
        return f"{self.launcher}/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "launcher": self.launcher,
            "entrypoint": self.name,
            "hardware": self.hardware,
            "steps": list(self.step_dicts),
            "text": self.text,
        }


def recording_of(plan: Plan, name: str | None = None, options: str = "") -> Recording:
    """The plan as text: a header naming launcher, entrypoint (with `options`, if any),
    hardware and the pinned sets its trainer names (`harness.pinned_sets`), then one block per
    step."""
    header = (
        f"# launcher: {plan.launcher.path}.py\n"
        f"# entrypoint: {plan.entrypoint}{' ' + options if options else ''}\n"
        f"# hardware: {plan.hardware.describe()}\n"
    )
    argvs = [argv for step in plan.steps if (argv := train_py_argv(step)) is not None]
    pinned = dict.fromkeys(line for argv in argvs for line in pinned_sets.described(argv))
    header += "".join(f"# constraints: {line}\n" for line in pinned)
    blocks = [step.render() for step in plan.steps]
    text = scrub(header + "".join(f"\n{block}\n" for block in blocks), plan.secret_env)
    steps = tuple(step.redacted() for step in plan.steps)
    dicts = tuple(scrub_data(step.to_dict(), plan.secret_env) for step in plan.steps)
    name = name or plan.entrypoint
    return Recording(plan.launcher.path, name, plan.hardware.name, steps, text, dicts)


def record(launcher: Launcher, name: str, args: LauncherArgs | None = None) -> Recording:
    """Record hermetically (frozen environment, placeholders, no probing) the recording `name`
    of `launcher` (see `Launcher.recordings`), or its entrypoint `name` with `args`."""
    if args is None and name in launcher.recordings:
        entrypoint, values = launcher.recordings[name]
        options = " ".join(f"{option(k)} {v}" for k, v in values.items())
        plan = build_plan(launcher, entrypoint, launcher.args(**values))
        return recording_of(plan, name, options)
    return recording_of(build_plan(launcher, name, args))


def record_all(launchers: Iterable[Launcher] | None = None) -> list[Recording]:
    """Hermetic recordings of every entrypoint of `launchers` (default: all discovered)."""
    if launchers is None:
        from harness.discovery import discover_launchers

        launchers = discover_launchers()
    return [record(lau, name) for lau in launchers for name in lau.recordings]


def main(argv: Sequence[str] | None = None) -> int:
    from harness.discovery import discover_launchers

    parser = argparse.ArgumentParser(prog="python -m harness.record", description=__doc__)
    parser.add_argument("modules", nargs="*", help="launcher modules (default: all)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    options = parser.parse_args(argv)
    launchers = [
        lau for lau in discover_launchers() if not options.modules or lau.module in options.modules
    ]
    if missing := set(options.modules) - {lau.module for lau in launchers}:
        parser.error(f"no launcher module {', '.join(sorted(missing))}")
    recordings = record_all(launchers)
    if options.format == "json":
        json.dump([r.to_dict() for r in recordings], sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(r.text for r in recordings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
