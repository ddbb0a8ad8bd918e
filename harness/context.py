"""The launch context an entrypoint emits into, and the plan it yields.

`build_plan` runs an entrypoint against a host view, then validates what it emitted (at least
one step; every ``python3 train.py`` argv accepted by ``trainer.arguments.parse_args``). Only a
validated plan reaches a runner, so bad input records and launches nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common.secrets import is_secret, secrets_in
from harness.bundle_manifest import bundle_dirs
from harness.cluster_shape import ClusterShape
from harness.errors import LaunchError
from harness.hardware import Hardware, get_hardware, match_hardware
from harness.host import HostView, record_host
from harness.launcher import Launcher, LauncherArgs, path_fields
from harness.steps import RayJobSubmit, Shell, Step, train_py_argv
from trainer.config.flags import option


@dataclass
class LaunchContext:
    """Passed to every entrypoint: the launcher, the host view, and the steps emitted so far.

    `dry_run` is set when the plan will be printed rather than run: an undetectable GPU then
    falls back to the recorded hardware with a note instead of failing.
    """

    launcher: Launcher
    host: HostView
    dry_run: bool = False
    steps: list[Step] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    hardware: Hardware | None = None

    def emit(self, step: Step) -> None:
        self.steps.append(step)

    def note(self, message: str) -> None:
        """One line for the user on stderr (never part of a recording)."""
        self.notes.append(message)

    def resolve_hardware(self, requested: str) -> Hardware:
        """`requested`, or for ``auto`` the recorded hardware (record host) or the detected one."""
        launcher = self.launcher
        if requested != "auto":
            name = requested
        elif self.host.detect is None:
            name = launcher.recorded_hardware
        else:
            description = self.host.detect()
            detected = match_hardware(description) if description else None
            if detected is not None:
                name = detected.name
            elif self.dry_run:
                name = launcher.recorded_hardware
                found = "found no GPU" if not description else "cannot tell which GPU this is"
                self.note(f"--hardware auto {found} on this host; showing {name}, the recording's")
            elif not description:
                raise LaunchError("--hardware auto found no GPU on this node; pass --hardware")
            else:
                first = description.strip().splitlines()[0]
                raise LaunchError(f"--hardware auto cannot tell which GPU {first!r} is; pass it")
        if name not in launcher.supported_hardware:
            raise LaunchError(
                f"{launcher.module} supports {', '.join(launcher.supported_hardware)}, not {name}"
            )
        self.hardware = get_hardware(name)
        return self.hardware

    def cluster(self, args: LauncherArgs) -> ClusterShape:
        """The cluster `args` ask for: their hardware (`resolve_hardware`), its GPUs per node
        (`gpus_per_node`), their node count, and the CPUs and training ranks of each node
        (`LauncherArgs.cpus_per_node`, `LauncherArgs.ranks_per_node`)."""
        hardware = self.resolve_hardware(args.hardware)
        gpus = self.gpus_per_node(hardware, args.num_gpus_per_node)
        ranks = gpus if args.ranks_per_node is None else args.ranks_per_node
        if ranks < 1:
            raise TypeError(
                f"{self.launcher.module}: on {hardware.name} its args name the training ranks "
                "per node (LauncherArgs.ranks_per_node)"
            )
        return ClusterShape(hardware, args.num_nodes, gpus, args.cpus_per_node, ranks)

    def gpus_per_node(self, hardware: Hardware, override: int | None) -> int:
        """`override`, else the count of visible devices on a live host, else the hardware's."""
        if hardware.device == "cpu":
            if override is not None:
                raise LaunchError(f"{hardware.name} has no GPU; drop --num-gpus-per-node")
            return 0
        if override is not None:
            count, source = override, "--num-gpus-per-node"
        elif visible := self.host.visible_devices(hardware.vendor):
            source, count = visible
            if not count:
                raise LaunchError(f"{source} is set but names no device")
        else:
            return hardware.gpus_per_node
        if count > hardware.gpus_per_node:
            raise LaunchError(
                f"{source} asks for {count} GPUs; "
                f"a {hardware.name} node has {hardware.gpus_per_node}"
            )
        return count


@dataclass(frozen=True)
class Plan:
    """A validated list of steps: what one entrypoint of a launcher will do on one host."""

    launcher: Launcher
    entrypoint: str
    hardware: Hardware
    host: HostView
    steps: tuple[Step, ...]
    notes: tuple[str, ...] = ()
    secrets: Mapping[str, str] = field(default_factory=dict)

    @property
    def secret_env(self) -> dict[str, str]:
        """Every secret this plan knows, by name: the host's and its ``--extra-env``'s, whose
        values recordings, dry runs and the console must never show."""
        return {**self.host.env, **self.secrets}


def resolve_args(args: LauncherArgs, host: HostView) -> LauncherArgs:
    """Absolute paths on `host`, a run id, the model and data dirs of a ``--from-bundle`` and,
    in a Slurm allocation, its node count and head node (`host` is the record host's frozen
    environment when recording: never Slurm's)."""
    values = {
        name: host.path(value)
        for name in path_fields(args)
        if (value := getattr(args, name)) is not None
    }
    if bundle := values.get("from_bundle"):
        values.update(_bundle_dirs(args, host, bundle))
    if args.num_nodes == 1 and (count := host.env.get("SLURM_JOB_NUM_NODES", "")).isdigit():
        values["num_nodes"] = int(count)
    if args.head_address is None and (nodelist := host.env.get("SLURM_JOB_NODELIST")):
        values["head_address"] = first_node(nodelist)
    return dataclasses.replace(args, run_id=args.run_id or host.run_id, **values)


def _bundle_dirs(args: LauncherArgs, host: HostView, bundle: str) -> dict[str, str]:
    """The bundle's model and data dirs; a ``--model-dir`` or ``--data-dir`` elsewhere is a
    contradiction (the Slurm script passes the bundle's on, resolved)."""
    defaults = {f.name: f.default for f in dataclasses.fields(args)}
    inside = bundle_dirs(bundle)
    for name, folder in inside.items():
        if host.path(getattr(args, name)) not in (host.path(defaults[name]), folder):
            raise LaunchError(
                f"--from-bundle reads the models and data sets in {bundle}; drop {option(name)}"
            )
    return inside


def first_node(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,9],cpu1`` gives ``gpu03``."""
    head = nodelist.split(",", 1)[0] if "[" not in nodelist.split(",", 1)[0] else nodelist
    prefix, bracket, ranges = head.partition("[")
    if not bracket:
        return prefix.strip()
    first = ranges.split(",", 1)[0].split("-", 1)[0].rstrip("]")
    return f"{prefix}{first}"


def build_plan(
    launcher: Launcher,
    entrypoint: str,
    args: LauncherArgs | None = None,
    host: HostView | None = None,
    *,
    dry_run: bool = False,
) -> Plan:
    """Run `entrypoint` of `launcher` on `host` (default: the record host) and validate it."""
    function = launcher.entrypoint(entrypoint)
    host = host or record_host()
    ctx = LaunchContext(launcher, host, dry_run=dry_run)
    args = resolve_args(args or launcher.args(), host)
    secrets = {name: value for name, value in args.extra_env_vars.items() if is_secret(name)}
    check_no_secret_in_argv(args, {**host.env, **secrets})
    function(ctx, args)
    if not ctx.steps:
        raise LaunchError(f"{launcher.module} {function.__name__} emitted no step")
    check_train_argv(ctx.steps, function.__name__)
    declared = args.hardware if args.hardware != "auto" else launcher.recorded_hardware
    hardware = ctx.hardware or get_hardware(declared)
    return Plan(
        launcher, function.__name__, hardware, host, tuple(ctx.steps), tuple(ctx.notes), secrets
    )


def check_no_secret_in_argv(args: LauncherArgs, env: Mapping[str, str]) -> None:
    """A secret's value in a ``--set`` would be in train.py's argv, which every user of the
    node can read (``ps``): refused, naming the variable, never the value."""
    if leaked := secrets_in("\n".join(args.set), env):
        raise LaunchError(
            f"--set holds the value of {leaked[0]}, a secret: argv is visible to every user of "
            f"the node; give it to the job by name (--pass-env {leaked[0]}) or with "
            "--extra-env, and let the job read it from its environment"
        )


def local_train_argvs(plan: Plan) -> list[tuple[str, ...]]:
    """The argv of each train.py that `plan` runs on this node: a plain command, or a job for
    a Ray of the run's own. A job for a cluster at an address runs on that cluster's nodes,
    which this host cannot check."""
    argvs = []
    for step in plan.steps:
        argv = train_py_argv(step)
        here = isinstance(step, Shell) or (isinstance(step, RayJobSubmit) and step.tag is not None)
        if argv is not None and here:
            argvs.append(argv)
    return argvs


def local_output_dirs(plan: Plan) -> list[tuple[str, str]]:
    """(flag, absolute directory) of each ``--output-dir`` and ``--save`` that a train.py of
    this node writes."""
    from trainer.arguments import parse_args

    dirs = []
    for argv in local_train_argvs(plan):
        paths = parse_args(argv).checkpoint
        for flag, value in (("--output-dir", paths.output_dir), ("--save", paths.save)):
            if value:
                dirs.append((flag, plan.host.path(value)))
    return dirs


def check_local_outputs(plan: Plan) -> None:
    """Before a live plan runs anything: the directories that a train.py of this node will
    write can be made and written, and nobody but this user (and root) can change them or a
    directory above them (another user could plant a symlink there and have the run
    overwrite a file of their choice)."""
    from common.owned_files import NotPrivate, owned_dir
    from trainer.run.file_checks import writable_dir_problem

    for flag, path in local_output_dirs(plan):
        if problem := writable_dir_problem(Path(path)):
            raise LaunchError(f"train.py {flag} {path}: {problem}")
        try:
            owned_dir(path)
        except NotPrivate as err:
            raise LaunchError(f"train.py {flag} {path}: {err}") from None


def check_local_inputs(plan: Plan) -> None:
    """What a train.py of this node reads (its model, tokenizer, prompt files, the checkpoint
    it resumes from) passes train.py's own input checks: a missing model or a prompt row
    without its label is one line before any Ray starts, not a job failing after it."""
    from trainer.arguments import parse_args
    from trainer.errors import UsageError
    from trainer.job.main import check_inputs
    from trainer.run.checkpoint import CheckpointError

    for argv in local_train_argvs(plan):
        try:
            check_inputs(parse_args(argv))
        except (UsageError, CheckpointError) as err:
            raise LaunchError(f"train.py would refuse its inputs: {err}") from None


def check_train_argv(steps: Sequence[Step], where: str) -> None:
    """The argv contract: train.py's own parser must accept every train.py argv in `steps`."""
    from trainer.arguments import UsageError, parse_args

    for step in steps:
        argv = train_py_argv(step)
        if argv is None:
            continue
        try:
            parse_args(argv)
        except UsageError as err:
            raise LaunchError(f"{where}: train.py would reject its argv: {err}") from None
