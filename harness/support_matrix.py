"""The LoRA support matrix of ``docs/lora.md``, generated from the launchers.

One row per launcher. The model, platform and backends come from the launcher itself: the
model it downloads (else its ``--hf-checkpoint`` directory), the hardware its ``hardware`` field
accepts, and the backends of the ``train.py`` argv it records, as ``train.py``'s own parser
resolves them. The evidence is what the launcher's declaration says (`Launcher.evidence`); a
launcher without it fails the test suite.

    python -m harness.support_matrix            print the table
    python -m harness.support_matrix --write    rewrite it in docs/lora.md
    python -m harness.support_matrix --check    exit 1 when docs/lora.md disagrees
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NoReturn

from harness.hardware import get_hardware
from harness.host import CHECKOUT
from harness.launcher import Launcher
from harness.record import record
from harness.steps import HubDownload, train_py_argv

DOC = Path(CHECKOUT) / "docs" / "lora.md"
BEGIN = "<!-- support-matrix:begin (python -m harness.support_matrix --write; do not edit) -->"
END = "<!-- support-matrix:end -->"

_PLATFORMS = {"amd": "ROCm", "nvidia": "CUDA"}
_HEADER = (
    "| Model | Platform | Training backend | Rollout backend | Evidence | Launcher |\n"
    "| --- | --- | --- | --- | --- | --- |"
)


class MatrixError(Exception):
    """A launcher or the doc the matrix cannot be built from: one line, exit status 2."""


def row(launcher: Launcher) -> str:
    """The launcher's row: what it downloads and the backends its train.py argv resolves to
    (their names as the backend registry gives them)."""
    from trainer.arguments import parse_args
    from trainer.backends import registry

    recordings = [record(launcher, name) for name in launcher.recordings]
    steps = [step for recording in recordings for step in recording.steps]
    argv = next((a for a in map(train_py_argv, steps) if a is not None), None)
    if argv is None:
        raise MatrixError(f"{launcher.module} submits no train.py job")
    args = parse_args(argv)
    models = [s.repo_id for s in steps if isinstance(s, HubDownload) and s.repo_type == "model"]
    model = ", ".join(f"`{m}`" for m in dict.fromkeys(models))
    model = model or f"`{Path(args.checkpoint.hf_checkpoint).name}` (built locally, no download)"
    vendor = launcher_vendor(launcher)
    platform = "CPU (no GPU)" if vendor == "cpu" else _PLATFORMS[vendor]
    if vendor != "cpu":
        platform += f" ({', '.join(launcher.supported_hardware)})"
    train, rollout_spec = registry.selected(args)
    training = train.display + (", colocated" if args.placement.colocate else "")
    rollout = rollout_spec.display
    if rollout_spec.name == "sglang":
        rollout += (
            f" (attention `{args.sglang.sglang_attention_backend or 'default'}`, "
            f"LoRA `{args.sglang.sglang_lora_backend or 'default'}`)"
        )
    evidence = launcher.evidence.strip()
    if not evidence:
        raise MatrixError(f"{launcher.module} declares no evidence (evidence= on its LAUNCHER)")
    link = f"[`{launcher.path}.py`](../{launcher.path}.py)"
    cells = (model, platform, training, rollout, evidence, link)
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def launcher_vendor(launcher: Launcher) -> str:
    vendors = {get_hardware(name).vendor for name in launcher.supported_hardware}
    if len(vendors) != 1:
        raise MatrixError(f"{launcher.module} mixes vendors: {', '.join(sorted(vendors))}")
    return vendors.pop()


def build_table(launchers: Iterable[Launcher] | None = None) -> str:
    """The Markdown table for `launchers` (default: every discovered launcher)."""
    if launchers is None:
        from harness.discovery import discover_launchers

        launchers = discover_launchers()
    return "\n".join([_HEADER, *(row(launcher) for launcher in launchers)])


def _section(text: str) -> tuple[int, int]:
    """Start and end offsets of the generated table between the markers of `text`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise MatrixError(f"the doc must hold the markers {BEGIN} and {END} once each, in order")
    return text.index(BEGIN) + len(BEGIN), text.index(END)


def current_table(text: str) -> str:
    start, end = _section(text)
    return text[start:end].strip()


def with_table(text: str, table: str) -> str:
    start, end = _section(text)
    return f"{text[:start]}\n{table}\n{text[end:]}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m harness.support_matrix", description=__doc__.split("\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the table in the doc")
    action.add_argument("--check", action="store_true", help="exit 1 when the doc disagrees")
    parser.add_argument("--doc", type=Path, default=DOC, help="default: docs/lora.md")
    options = parser.parse_args(argv)
    try:
        table = build_table()
        if not (options.write or options.check):
            print(table)
            return 0
        text = options.doc.read_text(encoding="utf-8")
        if options.check:
            if current_table(text) == table:
                return 0
            print(f"{options.doc} is stale: run {parser.prog} --write", file=sys.stderr)
            return 1
        options.doc.write_text(with_table(text, table), encoding="utf-8")
    except (MatrixError, OSError) as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
