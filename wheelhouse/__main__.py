"""`python -m wheelhouse {inventory,build,install,kernels}`: a wheelhouse for air-gapped GPU
nodes.

`inventory`, `install` and `kernels` run on the node with the standard library (and `common`)
only; `build` runs where PyPI is reachable and imports its helpers lazily.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

from common.command_line import run_command
from wheelhouse.batches import WheelhouseError

_DESCRIPTION = """\
Bring Python packages to a GPU node without internet:
  on the node:   python -m wheelhouse inventory -o node.json
  here:          python -m wheelhouse build --inventory node.json -r reqs.txt -o wh
  carry wh/batch-N to the node, then there:
                 python -m wheelhouse install wh/batch-1 wh/batch-2 [--target DIR]
  or, one batch at a time:  python -m wheelhouse install batch-N --stash ~/wheels
  after a run there, the kernels FlashInfer compiled, for the next node's wheelhouse:
                 python -m wheelhouse kernels -o built"""


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m wheelhouse",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = top.add_subparsers(dest="command", required=True)

    inv = sub.add_parser("inventory", help="describe this node (run ON the node)")
    inv.add_argument("-o", "--output", type=Path, help="write JSON here (default: stdout)")

    bld = sub.add_parser("build", help="download and batch wheels for a node (needs PyPI)")
    bld.add_argument("requirements", nargs="*", help="requirement specifiers")
    bld.add_argument(
        "-r",
        "--requirement",
        dest="requirement_files",
        type=Path,
        action="append",
        default=[],
        help="requirements file (repeatable)",
    )
    bld.add_argument(
        "-c",
        "--constraint",
        dest="constraints",
        type=Path,
        action="append",
        default=[],
        help="constraints file (repeatable)",
    )
    bld.add_argument("--inventory", type=Path, help="the node's `inventory` JSON")
    bld.add_argument("--python-version", help="the node's Python, e.g. 3.12 (without --inventory)")
    bld.add_argument(
        "--platform",
        dest="platforms",
        action="append",
        default=[],
        help="a platform tag the node accepts (repeatable; without --inventory)",
    )
    bld.add_argument("--implementation", default="cp", help="cp (default) or pp")
    bld.add_argument(
        "--no-deps",
        action="store_true",
        help="exactly the requirements given (pinned lists), no resolution",
    )
    bld.add_argument(
        "--keep",
        action="append",
        default=None,
        help="node package pinned and never re-resolved (repeatable; default torch)",
    )
    bld.add_argument("--batch-mib", type=float, default=60, help="batch size limit (default 60)")
    bld.add_argument("--slim", action="append", default=[], help="slimming profile (repeatable)")
    bld.add_argument("--cuda-arch", help="drop members only for newer GPUs, e.g. sm90")
    bld.add_argument(
        "--sdist",
        action="append",
        default=[],
        metavar="NAME==VERSION",
        help="carry this package's source distribution (no wheels exist); pip builds it on "
        "the node (repeatable)",
    )
    bld.add_argument("--find-links", action="append", default=[], help="passed to pip")
    bld.add_argument("--index-url", help="passed to pip")
    bld.add_argument("--no-index", action="store_true", help="passed to pip")
    bld.add_argument("-o", "--output", type=Path, required=True, help="output folder")

    ins = sub.add_parser("install", help="install carried batches (run ON the node, offline)")
    ins.add_argument("batches", nargs="+", type=Path, help="batch folders")
    ins.add_argument("--target", type=Path, help="install into this folder (pip --target)")
    ins.add_argument(
        "--stash", type=Path, help="collect batches here first; installs once all have arrived"
    )
    ins.add_argument(
        "--keep-built",
        type=Path,
        help="copy the wheels built from source distributions here (carry them back and pass "
        "--find-links to the next build instead of --sdist)",
    )

    ker = sub.add_parser(
        "kernels",
        help="pack the kernels FlashInfer compiled on this node as a wheel (run ON the node)",
    )
    ker.add_argument(
        "--cache",
        type=Path,
        help="FlashInfer's cache folder (default: .cache/flashinfer in "
        "$FLASHINFER_WORKSPACE_BASE, else in the home folder)",
    )
    ker.add_argument(
        "--add",
        type=Path,
        action="append",
        default=[],
        metavar="WHEEL",
        help="a wheel this command packed earlier (e.g. the one installed on this node): its "
        "kernels are packed too, beside those compiled here (repeatable)",
    )
    ker.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    return top


def run_inventory(args: argparse.Namespace) -> None:
    from wheelhouse.inventory import inventory

    text = json.dumps(inventory(), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return
    args.output.write_text(text)
    print(f"wrote {args.output}")


def run_build(args: argparse.Namespace) -> None:
    from wheelhouse.build import BuildRequest, build, read_requirements
    from wheelhouse.inventory import expand_platform
    from wheelhouse.profiles import PROFILES
    from wheelhouse.sdists import parse_pin
    from wheelhouse.slim import parse_arch
    from wheelhouse.target import Target, from_inventory

    if args.inventory is not None:
        if args.python_version or args.platforms:
            raise WheelhouseError("give --inventory or --python-version/--platform, not both")
        target = from_inventory(args.inventory)
    elif args.python_version and args.platforms:
        platforms = [t for p in args.platforms for t in expand_platform(p)]
        target = Target(args.python_version, tuple(dict.fromkeys(platforms)), args.implementation)
    else:
        raise WheelhouseError(
            "say which node: --inventory FILE, or --python-version and --platform"
        )
    if args.batch_mib <= 0:
        raise WheelhouseError("--batch-mib must be positive")
    unknown = sorted(set(args.slim) - set(PROFILES))
    if unknown:
        raise WheelhouseError(
            f"unknown --slim profile {', '.join(unknown)} (known: {', '.join(sorted(PROFILES))})"
        )
    request = BuildRequest(
        target=target,
        requirements=read_requirements(args.requirements, args.requirement_files),
        constraints=args.constraints,
        out=args.output,
        batch_mib=args.batch_mib,
        no_deps=args.no_deps,
        keep=tuple(args.keep or ["torch"]),
        slim=tuple(args.slim),
        cuda_arch=parse_arch(args.cuda_arch) if args.cuda_arch else None,
        sdists=dict(parse_pin(p) for p in args.sdist),
        index_url=args.index_url,
        find_links=tuple(args.find_links),
        no_index=args.no_index,
    )
    for line in build(request):
        print(line)


def run_install(args: argparse.Namespace) -> None:
    from wheelhouse.install import install

    print(install(args.batches, args.target, args.stash, args.keep_built))


def run_kernels(args: argparse.Namespace) -> None:
    from wheelhouse.kernels import flashinfer_cache, pack

    for line in pack(args.cache or flashinfer_cache(), args.output, args.add):
        print(line)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    handlers = {
        "inventory": run_inventory,
        "build": run_build,
        "install": run_install,
        "kernels": run_kernels,
    }
    return run_command(
        "wheelhouse", partial(handlers[args.command], args), WheelhouseError, status=2
    )


if __name__ == "__main__":
    sys.exit(main())
