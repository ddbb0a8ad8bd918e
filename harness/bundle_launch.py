"""A launch from a bundle (``--from-bundle DIR``, `harness.bundle_manifest`): its `prepare`
checks the bundle instead of downloading or building (`harness.context` points the model and
data dirs into it, `harness.ray_job` turns the Hub offline for its job).
"""

from __future__ import annotations

import functools
from pathlib import Path

from harness.bundle_manifest import BundleError, check_holds, items_of, read_manifest, verify
from harness.context import LaunchContext
from harness.errors import LaunchError
from harness.launcher import Entrypoint, LauncherArgs
from harness.steps import VerifyBundle


def prepare_or_verify(prepare: Entrypoint) -> Entrypoint:
    """`prepare`, or with ``--from-bundle DIR`` the check of that bundle in its stead, while
    the plan is built: that it holds what this launch's `prepare` makes and that every file
    is there with its size and, live, its sha256. A missing or damaged file is one line and
    exit 2 before any step runs or anything is written (the output directories included)."""

    @functools.wraps(prepare)
    def entrypoint(ctx: LaunchContext, args: LauncherArgs) -> None:
        if args.from_bundle is None:
            return prepare(ctx, args)
        planned = LaunchContext(ctx.launcher, ctx.host, dry_run=True)
        prepare(planned, args)  # what this launch would make: the bundle must hold it
        try:
            expected = items_of(planned.steps, args.from_bundle)
            check_holds(read_manifest(Path(args.from_bundle)), expected)
            verify(args.from_bundle, hashes=not ctx.dry_run)  # a dry run hashes nothing
        except BundleError as err:
            raise LaunchError(f"--from-bundle: {err}") from None
        ctx.emit(VerifyBundle(args.from_bundle, ctx.host.checkout))

    return entrypoint
