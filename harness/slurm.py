"""A Slurm batch script for a multi-node run: the head trains, every other node is a worker.

The script runs on the allocation's first node: it starts ``worker`` on the other nodes with
``srun``, then ``train`` on itself. Inside the allocation both read the node count and the head
from Slurm (``SLURM_JOB_NUM_NODES``, ``SLURM_JOB_NODELIST``); the launcher options given to
``sbatch`` are passed on, so head and workers agree on the run id, ports and paths.
"""

from __future__ import annotations

import dataclasses
import shlex
import unicodedata
from typing import Any

from common.secrets import is_secret
from harness.context import LaunchContext
from harness.errors import LaunchError
from harness.launcher import LauncherArgs
from harness.steps import WriteFile
from trainer.config.flags import option

# Resolved per node from the allocation, never fixed in the script.
_FROM_ALLOCATION = ("num_nodes", "head_address")


def option_argv(args: LauncherArgs) -> list[str]:
    """The options that reproduce `args` (paths and run id always; others when not default)."""
    argv: list[str] = []
    for field in dataclasses.fields(args):
        value: Any = getattr(args, field.name)
        always = field.metadata.get("path") or field.name == "run_id"
        if field.name in _FROM_ALLOCATION or (value == field.default and not always):
            continue
        if isinstance(value, bool):
            argv.append(option(field.name) if value else f"--no-{option(field.name)[2:]}")
        elif isinstance(value, tuple):
            argv += [token for item in value for token in (option(field.name), item)]
        elif value is not None:
            argv += [option(field.name), str(value)]
    return argv


def without_secrets(args: LauncherArgs) -> LauncherArgs:
    """`args` as the script passes them on, holding no secret: the secret items of
    ``--extra-env`` become ``--pass-env`` names, whose values Slurm hands from the submitting
    environment to the job (its default ``--export=ALL``)."""
    extra = args.extra_env_vars
    secret = [name for name in extra if is_secret(name)]
    kept = ",".join(f"{name}={value}" for name, value in extra.items() if name not in secret)
    passed = ",".join(dict.fromkeys([*args.pass_env_names, *secret]))
    return dataclasses.replace(args, extra_env=kept, pass_env=passed)


def batch_script(ctx: LaunchContext, args: LauncherArgs, gpus_per_node: int) -> str:
    """The script; every value in it is quoted for the shell (shlex), and for sbatch's reading
    of ``#SBATCH`` lines, which takes shell quotes but ends at a newline and drops backslashes.
    It holds no secret (`without_secrets`): each variable passed by name must be exported
    when it is submitted, else it stops at once and says so.
    """
    module = shlex.quote(ctx.launcher.module)
    args = without_secrets(args)
    options = shlex.join(option_argv(args))
    _check_directive_value("--output-dir", args.output_dir)
    output = f"{args.output_dir}/{args.run_id}".replace("%", "%%") + "/slurm-%j.out"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={shlex.quote(str(args.run_id))}",
        f"#SBATCH --nodes={args.num_nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []),
        "#SBATCH --exclusive",
        f"#SBATCH --output={shlex.quote(output)}",
        "set -euo pipefail",
        *(f': "${{{name}:?export {name} before sbatch}}"' for name in args.pass_env_names),
        f"cd {shlex.quote(ctx.host.checkout)}",
        # the first host; sed reads the whole list, where `head -n 1` would close the pipe on a
        # long one and scontrol's SIGPIPE fail the script under pipefail
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        'if [ "$SLURM_JOB_NUM_NODES" -gt 1 ]; then',
        '  srun --nodes=$((SLURM_JOB_NUM_NODES - 1)) --ntasks-per-node=1 --exclude="$head" \\',
        f"    python3 -m {module} worker {options} &",
        "fi",
        f"python3 -m {module} train {options}",
    ]
    return "\n".join(lines) + "\n"


def _check_directive_value(option: str, value: str) -> None:
    """`LaunchError` for what no quoting carries in an ``#SBATCH`` line."""
    if "\\" in value or any(unicodedata.category(c) == "Cc" for c in value):
        raise LaunchError(
            f"{option} {value!r}: a Slurm batch script cannot hold a path with a backslash or "
            "a control character (newline, tab, ...); choose another"
        )


def write_batch_script(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Emit the writing of ``<output-dir>/<run-id>/sbatch.sh`` (submit it with ``sbatch``),
    which asks Slurm for each node's GPUs of the cluster (`LaunchContext.cluster`)."""
    path = f"{args.output_dir}/{args.run_id}/sbatch.sh"
    script = batch_script(ctx, args, ctx.cluster(args).gpus_per_node)
    ctx.emit(WriteFile(path, script, 0o755))
    if not ctx.dry_run:
        ctx.note(f"submit it with: sbatch {shlex.quote(path)}")
