"""Whether a launcher change changed what train.py is told: every recording's train.py argv,
parsed by ``train.py --validate-only``'s parser, at a base revision and in the working tree.

    python -m harness.config_diff --base origin/main

The launcher diff (`harness.diff`) compares flags as written; this compares their meaning:
flags reordered, or defaults written or dropped, parse to the same configuration. Each tree
parses its own recordings with its own parser. Prints one line per recording (``same`` or the
settings that differ) and exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.diff import DiffError, repo_root, resolve_revision

# Run in a tree with its own harness and trainer: {recording: [parsed config per train argv]}.
_PARSE = """
import json, sys
from harness.record import record_all
from harness.steps import train_py_argv
from trainer.arguments import parse_args
configs = {}
for recording in record_all():
    argvs = [argv for step in recording.steps if (argv := train_py_argv(step)) is not None]
    name = f"{recording.launcher}/{recording.name}"
    configs[name] = [parse_args(argv).as_dict() for argv in argvs]
json.dump(configs, sys.stdout, default=str, sort_keys=True)
"""

Configs = dict[str, list[dict[str, Any]]]


def parsed_configs(tree: Path) -> Configs:
    """The parsed training configs of every recording of the launchers in `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _PARSE], cwd=tree, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["failed"]
        raise DiffError(f"cannot parse the recordings of {tree}: {lines[-1]}")
    return json.loads(done.stdout)


def base_configs(repo: Path, rev: str) -> Configs:
    """`parsed_configs` of revision `rev`, in a temporary worktree removed afterwards."""
    sha = resolve_revision(repo, rev)
    folder = Path(tempfile.mkdtemp(prefix="config-diff-"))
    tree = folder / "base"
    try:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(tree), sha],
            check=True,
            capture_output=True,
        )
        return parsed_configs(tree)
    finally:
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)


def differences(base: Mapping[str, list[dict]], head: Mapping[str, list[dict]]) -> list[str]:
    """One line per recording: ``same``, or what differs between `base` and `head`."""
    lines = []
    for name in sorted(base.keys() | head.keys()):
        old, new = base.get(name), head.get(name)
        if old is None or new is None:
            lines.append(f"{name}: only in {'the working tree' if old is None else 'the base'}")
        elif len(old) != len(new):
            lines.append(f"{name}: {len(old)} train.py argv(s) before, {len(new)} now")
        else:
            changed = sorted(
                f"{key} {a.get(key)!r} -> {b.get(key)!r}"
                for a, b in zip(old, new, strict=True)
                for key in a.keys() | b.keys()
                if a.get(key) != b.get(key)
            )
            lines.append(f"{name}: {'same' if not changed else '; '.join(changed)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.config_diff", description=__doc__)
    parser.add_argument("--base", required=True, help="git revision to compare with")
    options = parser.parse_args(argv)
    try:
        root = repo_root(Path.cwd())
        lines = differences(base_configs(root, options.base), parsed_configs(root))
    except DiffError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print("\n".join(lines))
    return 0 if all(line.endswith(": same") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
