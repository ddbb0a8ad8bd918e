"""What a change does to the launchers: a flag-level diff of every recording against a git revision.

    python -m harness.diff --base origin/main [--format text|markdown]

The base revision is recorded by its own code (``python -m harness.record --format json`` in a
temporary ``git worktree``), the working tree by this one; both are compared as structured steps
(kind, ordered flags, environment), never as text. Exit status 1 when anything differs, 0 when
nothing does, 2 on bad input or when either side cannot be recorded (a broken tree is never
reported as a mere difference).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

Recordings = list[dict[str, Any]]
Action = Literal["added", "removed", "changed", "reordered"]

_FLAG = re.compile(r"^--?[A-Za-z]")
_TABLE_HEAD = "| step | change | name | old | new |\n| --- | --- | --- | --- | --- |"


class DiffError(Exception):
    """Bad input or a revision that cannot be recorded: one line, exit status 2."""


@dataclass(frozen=True)
class StepView:
    """A recorded step as the diff sees it: a label, ordered flags, environment, other settings."""

    kind: str
    identity: str
    flags: tuple[tuple[str, str | None], ...]
    env: Mapping[str, str]
    settings: Mapping[str, str]

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.identity

    @property
    def label(self) -> str:
        return f"{self.kind} {self.identity}".strip()


@dataclass(frozen=True)
class Change:
    """One difference. `what` is flag, env, setting, flags, step, hardware or entrypoint."""

    what: str
    action: Action
    name: str
    old: str | None = None
    new: str | None = None
    step: str = ""


@dataclass
class LauncherDiff:
    launcher: str
    status: Literal["added", "removed", "changed"] = "changed"
    entrypoints: tuple[str, ...] = ()
    changes: dict[str, list[Change]] = field(default_factory=dict)


def split_command(argv: Sequence[str]) -> tuple[str, tuple[tuple[str, str | None], ...]]:
    """(``python3 train.py``, ((flag, value or None), ...)) of a command line.

    A flag's value is every token up to the next flag (``--eval-prompt-data NAME PATH``); a
    flag with no value (``--colocate``) has None. ``python3 -m MODULE`` counts as the command.
    """
    argv = list(argv)
    command: list[str] = []
    index = 0
    while index < len(argv) and not _FLAG.match(argv[index]):
        command.append(argv[index])
        index += 1
        if command[-1].startswith("python") and argv[index : index + 1] == ["-m"]:
            command += argv[index : index + 2]
            index += 2
    flags: list[tuple[str, list[str]]] = []
    for token in argv[index:]:
        if _FLAG.match(token):
            flags.append((token, []))
        else:
            flags[-1][1].append(token)
    return shlex.join(command), tuple((name, shlex.join(v) if v else None) for name, v in flags)


def step_view(step: Mapping[str, Any]) -> StepView:
    """The diff's view of one step of ``Recording.to_dict()``."""
    if step["kind"] == "write_file" and step["path"].endswith("/rayjob.yaml"):
        return _rayjob_view(step)
    identity = ""
    flags: tuple[tuple[str, str | None], ...] = ()
    env: dict[str, str] = {}
    settings: dict[str, str] = {}
    for name, value in sorted(step.items()):
        if name == "kind":
            continue
        if name == "env":
            env.update(value)
        elif name == "runtime_env":
            env.update(value.get("env_vars", {}))
            settings.update(
                {f"runtime_env.{k}": _text(v) for k, v in value.items() if k != "env_vars"}
            )
        elif name in ("entrypoint", "argv"):
            identity, flags = split_command(value)
        else:
            settings[name] = _text(value)
    if "repo_id" in step:
        identity = step["repo_id"]
    elif step["kind"] == "ray_start":
        identity = "head" if step.get("head") else "worker"
    return StepView(step["kind"], identity, flags, env, settings)


def _rayjob_view(step: Mapping[str, Any]) -> StepView:
    """A KubeRay RayJob manifest that ``rayjob`` writes, seen as the job it runs: the flags of
    its train.py entrypoint, its job's environment, and every other value by its path (a list
    of named items, as Kubernetes has them, by name)."""
    import yaml

    manifest = yaml.safe_load(step["content"])
    spec = manifest["spec"]
    identity, flags = split_command(shlex.split(spec.pop("entrypoint")))
    runtime_env = yaml.safe_load(spec.pop("runtimeEnvYAML"))
    env = runtime_env.pop("env_vars", {})
    settings = {"path": step["path"], "mode": _text(step["mode"])}
    settings |= _leaves(runtime_env, "runtimeEnv") | _leaves(manifest, "")
    return StepView("rayjob", identity, flags, env, settings)


def _leaves(value: Any, path: str) -> dict[str, str]:
    """{path: value} of every scalar under `value`."""
    if isinstance(value, dict):
        pairs = value.items()
    elif isinstance(value, list) and all(isinstance(v, dict) and "name" in v for v in value):
        pairs = ((item["name"], item) for item in value)
    elif isinstance(value, list) and all(isinstance(v, dict) and "groupName" in v for v in value):
        pairs = ((item["groupName"], item) for item in value)
    elif isinstance(value, list):
        pairs = enumerate(value)
    else:
        return {path: _text(value)}
    leaves: dict[str, str] = {}
    for key, item in pairs:
        inner = f"{path}[{key}]" if isinstance(value, list) else f"{path}.{key}" if path else key
        leaves |= _leaves(item, inner)
    return leaves


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _merged(flags: Iterable[tuple[str, str | None]]) -> dict[str, str | None]:
    """Flags by name; a repeated flag's values are joined with ``; ``."""
    merged: dict[str, str | None] = {}
    for name, value in flags:
        if name in merged:
            merged[name] = "; ".join(v or "(set)" for v in (merged[name], value))
        else:
            merged[name] = value
    return merged


def _mapping_changes(
    what: str, old: Mapping[str, str | None], new: Mapping[str, str | None], step: str
) -> list[Change]:
    changes = []
    for name in [*old, *(n for n in new if n not in old)]:
        if name not in new:
            changes.append(Change(what, "removed", name, old=old[name], step=step))
        elif name not in old:
            changes.append(Change(what, "added", name, new=new[name], step=step))
        elif old[name] != new[name]:
            changes.append(Change(what, "changed", name, old[name], new[name], step))
    return changes


def diff_steps(old: StepView, new: StepView) -> list[Change]:
    """Flags, flag order, environment and settings of two steps with the same key."""
    old_flags, new_flags = _merged(old.flags), _merged(new.flags)
    changes = _mapping_changes("flag", old_flags, new_flags, new.label)
    common = [name for name in old_flags if name in new_flags]
    if common != [name for name in new_flags if name in old_flags]:
        changes.append(Change("flags", "reordered", "order of the common flags", step=new.label))
    changes += _mapping_changes("env", old.env, new.env, new.label)
    changes += _mapping_changes("setting", old.settings, new.settings, new.label)
    return changes


def diff_entrypoint(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Hardware, then steps aligned by (kind, identity): added, removed, or compared."""
    changes = []
    if old["hardware"] != new["hardware"]:
        changes.append(Change("hardware", "changed", "hardware", old["hardware"], new["hardware"]))
    old_steps = [step_view(step) for step in old["steps"]]
    new_steps = [step_view(step) for step in new["steps"]]
    matcher = difflib.SequenceMatcher(
        None, [s.key for s in old_steps], [s.key for s in new_steps], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for before, after in zip(old_steps[i1:i2], new_steps[j1:j2], strict=True):
                changes += diff_steps(before, after)
            continue
        changes += [Change("step", "removed", step.label) for step in old_steps[i1:i2]]
        changes += [Change("step", "added", step.label) for step in new_steps[j1:j2]]
    return changes


def _by_launcher(recordings: Recordings) -> dict[str, dict[str, Mapping[str, Any]]]:
    launchers: dict[str, dict[str, Mapping[str, Any]]] = {}
    for recording in recordings:
        launchers.setdefault(recording["launcher"], {})[recording["entrypoint"]] = recording
    return launchers


def diff_recordings(base: Recordings, head: Recordings) -> list[LauncherDiff]:
    """Every difference between two sets of recordings, launcher by launcher."""
    old, new = _by_launcher(base), _by_launcher(head)
    diffs = []
    for launcher in sorted(old.keys() | new.keys()):
        if launcher not in old:
            diffs.append(LauncherDiff(launcher, "added", tuple(new[launcher])))
            continue
        if launcher not in new:
            diffs.append(LauncherDiff(launcher, "removed", tuple(old[launcher])))
            continue
        diff = LauncherDiff(launcher)
        before, after = old[launcher], new[launcher]
        for entrypoint in [*after, *(e for e in before if e not in after)]:
            if entrypoint not in before:
                changes = [Change("entrypoint", "added", entrypoint)]
            elif entrypoint not in after:
                changes = [Change("entrypoint", "removed", entrypoint)]
            else:
                changes = diff_entrypoint(before[entrypoint], after[entrypoint])
            if changes:
                diff.changes[entrypoint] = changes
        if diff.changes:
            diffs.append(diff)
    return diffs


def _value(value: str | None) -> str:
    return "(set)" if value is None else value


def _describe(change: Change) -> str:
    head = f"{change.what} {change.action}: {change.name}"
    if change.action == "changed":
        return f"{head}: {_value(change.old)} -> {_value(change.new)}"
    shown = change.new if change.action == "added" else change.old
    return f"{head} {shown}" if shown is not None else head


def format_text(diffs: Sequence[LauncherDiff], base: str) -> str:
    if not diffs:
        return f"No launcher changes against {base}.\n"
    lines = [f"Launcher changes against {base}:"]
    for diff in diffs:
        if diff.status != "changed":
            entrypoints = ", ".join(diff.entrypoints)
            lines.append(f"launcher {diff.status}: {diff.launcher}.py ({entrypoints})")
            continue
        for entrypoint, changes in diff.changes.items():
            lines.append(f"{diff.launcher}.py {entrypoint}:")
            step = None
            for change in changes:
                if change.step and change.step != step:
                    lines.append(f"  {change.step}:")
                step = change.step
                lines.append(f"{'    ' if step else '  '}{_describe(change)}")
    return "\n".join(lines) + "\n"


def _code(value: str | None) -> str:
    """`value` as a Markdown code span that survives a table cell."""
    if value is None:
        return ""
    text = value.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


def format_markdown(diffs: Sequence[LauncherDiff], base: str) -> str:
    blocks = [f"### Launcher diff against `{base}`"]
    if not diffs:
        blocks.append("No launcher changes.")
    whole = [
        f"- launcher {d.status}: `{d.launcher}.py` ({', '.join(d.entrypoints)})"
        for d in diffs
        if d.status != "changed"
    ]
    if whole:
        blocks.append("\n".join(whole))
    for diff in diffs:
        for entrypoint, changes in diff.changes.items():
            rows = [
                f"| {_code(c.step or None)} | {c.what} {c.action} | {_code(c.name)} "
                f"| {_code(c.old)} | {_code(c.new)} |"
                for c in changes
            ]
            blocks.append(f"**`{diff.launcher}.py` · `{entrypoint}`**")
            blocks.append("\n".join([_TABLE_HEAD, *rows]))
    return "\n\n".join(blocks) + "\n"


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
    )


def repo_root(cwd: Path) -> Path:
    done = _git(cwd, "rev-parse", "--show-toplevel")
    if done.returncode != 0:
        raise DiffError(f"{cwd} is not in a git repository")
    return Path(done.stdout.strip())


def resolve_revision(repo: Path, rev: str) -> str:
    done = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise DiffError(f"unknown revision {rev!r}")
    return done.stdout.strip()


def record_checkout(tree: Path, what: str) -> Recordings:
    """The recordings of the checkout at `tree`, made by its own code in a subprocess.

    A checkout without ``harness/record.py`` predates the harness: it has no launcher.
    """
    if not (tree / "harness" / "record.py").is_file():
        return []
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "harness.record", "--format", "json"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise DiffError(f"cannot record {what}: {lines[-1]}")
    try:
        return json.loads(done.stdout)
    except ValueError as err:
        raise DiffError(f"cannot record {what}: its recordings are not JSON ({err})") from None


def record_revision(repo: Path, rev: str) -> Recordings:
    """Record `rev` in a temporary detached worktree, removed again whatever happens (SIGTERM
    and SIGHUP included: `main` turns them into an exception that unwinds to here)."""
    sha = resolve_revision(repo, rev)
    tmp = tempfile.mkdtemp(prefix="launcher-diff-")
    tree = Path(tmp) / "base"
    try:
        added = _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), sha)
        if added.returncode != 0:
            raise DiffError(f"cannot check out {rev}: {added.stderr.strip()}")
        return record_checkout(tree, rev)
    finally:
        with _signals_deferred():
            _git(repo, "worktree", "remove", "--force", str(tree))
            shutil.rmtree(tmp, ignore_errors=True)


def record_working_tree(root: Path) -> Recordings:
    """The working tree's recordings: in this process when it is the checkout imported here."""
    from harness.host import CHECKOUT

    if root.resolve() != Path(CHECKOUT).resolve():
        return record_checkout(root, "the working tree")
    try:
        from harness.record import record_all

        recordings = [recording.to_dict() for recording in record_all()]
    except (Exception, SystemExit) as err:  # a failure to record is never a "difference"
        message = " ".join(str(err).split()) or type(err).__name__
        raise DiffError(f"cannot record the working tree: {message}") from None
    return json.loads(json.dumps(recordings))


_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """Ctrl-C, SIGTERM or SIGHUP ended the diff (after its cleanup); exit status 128 + the
    signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Within: Ctrl-C, SIGTERM and SIGHUP wait (so a cleanup runs to its end); then they are
    handled."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPPING_SIGNALS)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m harness.diff", description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare with")
    parser.add_argument("--format", choices=("text", "markdown"), default="text")
    options = parser.parse_args(argv)
    previous = {signum: signal.signal(signum, _raise_stopped) for signum in _STOPPING_SIGNALS}
    try:
        root = repo_root(Path.cwd())
        base = record_revision(root, options.base)
        head = record_working_tree(root)
    except DiffError as err:
        parser.error(str(err))
    except Stopped as stopped:
        print(f"{parser.prog}: error: stopped by {stopped}", file=sys.stderr)
        return 128 + stopped.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    diffs = diff_recordings(base, head)
    render = format_markdown if options.format == "markdown" else format_text
    sys.stdout.write(render(diffs, options.base))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
