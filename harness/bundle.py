"""A bundle: what a launcher's `prepare` makes, in a folder that can be carried to a node without
internet, with a manifest of every file's size and sha256.

Record mode knows every input a launch reads: `prepare`'s Hub downloads (``HubDownload``) and
what it builds (``Shell``: the CPU recipe's ``trainer.tiny``). ``make`` runs exactly those with
the launcher's ``--model-dir`` and ``--data-dir`` inside the bundle (``DIR/models``,
``DIR/datasets``): each Hub repository at the commit it had when the download began
(``huggingface_hub.snapshot_download``: progress bars, and a rerun resumes), then writes
``DIR/manifest.json`` (`harness.bundle_manifest`) last, so a folder with a manifest is a whole
bundle. On the node, ``--from-bundle DIR`` points the launch's model and data directories into
the bundle and turns `prepare` into the check of the bundle against its manifest
(`harness.bundle_launch`), which refuses a missing or damaged file in one line before anything
starts; the job then runs with the Hub clients offline (`harness.ray_job`).

    python -m harness.bundle make launchers.cpu.run_tiny_qwen3_lora DIR [--set NAME=VALUE]
    python -m harness.bundle verify DIR

The manifest holds no secret: ``HF_TOKEN`` is read from the environment by huggingface_hub.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from common.command_line import run_command
from common.owned_files import NotPrivate, owned_dir
from harness.bundle_manifest import (
    MANIFEST,
    PROG,
    BundleError,
    Item,
    bundle_dirs,
    file_count,
    items_of,
    verify,
    write_manifest,
)
from harness.context import build_plan
from harness.discovery import declared_launcher
from harness.errors import LaunchError
from harness.host import local_host
from harness.launcher import Launcher
from harness.steps import HubDownload, Shell, Step
from trainer.errors import first_line


def make(launcher: Launcher, root: str, settings: Sequence[str], *, dry_run: bool = False) -> None:
    """Run `launcher`'s `prepare` into the bundle at `root`, then write its manifest."""
    host = local_host()
    root = host.path(root)
    args = launcher.args(**bundle_dirs(root), set=tuple(settings))
    plan = build_plan(launcher, "prepare", args, host, dry_run=dry_run)
    items = items_of(plan.steps, root)
    if dry_run:
        for step in plan.steps:
            print(step.render() + "\n")
        print(f"# then {root}/{MANIFEST}: every file's size and sha256")
        return
    if (Path(root) / MANIFEST).exists():
        raise BundleError(f"{root} already holds a bundle; check it with `{PROG} verify {root}`")
    try:
        owned_dir(root)
    except (NotPrivate, OSError) as err:
        raise BundleError(f"{root}: {err}") from None
    made = [_make_item(step, item) for step, item in zip(plan.steps, items, strict=True)]
    manifest = write_manifest(Path(root), launcher.module, made)
    count = file_count(manifest)
    inputs = f"{len(made)} input{'s' if len(made) != 1 else ''}"
    print(f"bundle {root}: {count} files of {inputs}, manifest {root}/{MANIFEST}")


def _make_item(step: Step, item: Item) -> Item:
    """Run `step` of `prepare` into the bundle: a download pins the commit it got; a build (a
    `Shell`, as `items_of` allows) runs as live mode runs it."""
    from harness.live import StepFailed, live_env, run_step

    if isinstance(step, HubDownload):
        print(f"==> downloading {step.repo_type} {step.repo_id}", file=sys.stderr, flush=True)
        return Item({**item.source, "revision": download(step)}, item.dirs)
    if isinstance(step, Shell):
        print(f"==> {shlex.join(step.argv)}", file=sys.stderr, flush=True)
    try:
        run_step(step, live_env())
    except StepFailed as err:
        raise BundleError(str(err)) from None
    return item


def download(step: HubDownload) -> str:
    """Download `step`'s repository at its current commit (resuming what an earlier try left);
    returns that commit."""
    from huggingface_hub import HfApi

    from harness.live import hub_download

    try:
        revision = HfApi().repo_info(step.repo_id, repo_type=step.repo_type).sha
        hub_download(step, revision)
    except Exception as err:  # the Hub raises many types; each is one failed download
        raise BundleError(f"downloading {step.repo_id}: {first_line(err)}") from None
    return str(revision)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make_ = commands.add_parser("make", help="make the bundle of a launcher's prepare (online)")
    make_.add_argument("launcher", help="its module: launchers.cpu.run_tiny_qwen3_lora")
    make_.add_argument("dir", help="the bundle's folder")
    make_.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a training setting, as the launch's own --set (what prepare makes depends on "
        "some: the CPU recipe's seed, the Qwen3-4B recipe's eval set)",
    )
    make_.add_argument("--dry-run", action="store_true", help="print what it would run")
    check = commands.add_parser("verify", help="check every file of a bundle (on the node)")
    check.add_argument("dir", help="the bundle's folder")
    options = parser.parse_args(argv)
    if options.command == "verify":
        return run_command(PROG, lambda: _verified(options.dir), BundleError, status=2)

    def action() -> None:
        try:
            launcher = declared_launcher(options.launcher)
            make(launcher, options.dir, options.set, dry_run=options.dry_run)
        except LaunchError as err:
            raise BundleError(str(err)) from None

    return run_command(PROG, action, BundleError, status=2)


def _verified(root: str) -> None:
    manifest = verify(root)
    count = file_count(manifest)
    print(f"bundle {root}: {count} files as its manifest says ({manifest['launcher']})")


if __name__ == "__main__":
    sys.exit(main())
