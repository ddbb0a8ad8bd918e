"""Building blocks of a training launch: train.py flags, wandb flags, and `execute_train`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.context import LaunchContext
from harness.errors import LaunchError
from harness.hardware import Hardware
from harness.launcher import LauncherArgs, flag
from harness.platform import platform_env
from harness.steps import ProcessCleanup, RayJobSubmit, RayStart, RayStop

# Host variables a job needs when the host sets them: network interfaces, NCCL debugging, Hub
# access, the wandb entity. Secrets among them (HF_TOKEN) travel only in the runtime env.
FORWARDED_ENV = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_DEBUG",
    "NCCL_DEBUG_FILE",
    "HF_TOKEN",
    "HF_ENDPOINT",
    "WANDB_ENTITY",
    "WANDB_BASE_URL",
)
# Ray uploads the checkout as the job's working_dir; it honours .gitignore, not these.
WORKING_DIR_EXCLUDES = (".git", ".venv")


def flags(**values: Any) -> list[str]:
    """train.py flags from keyword arguments, in order.

    ``lora_rank=64`` gives ``--lora-rank 64``; True gives a bare flag, False and None nothing;
    a tuple or list gives one flag followed by several values.
    """
    argv: list[str] = []
    for name, value in values.items():
        if value is None or value is False:
            continue
        argv.append(flag(name))
        if isinstance(value, (tuple, list)):
            argv += [str(v) for v in value]
        elif value is not True:
            argv.append(str(value))
    return argv


def wandb_flags(ctx: LaunchContext, args: LauncherArgs) -> list[str]:
    """Wandb flags when wandb will log: offline mode, or online with WANDB_API_KEY set.

    The key itself never appears in argv; `execute_train` puts it in the job's runtime env.
    """
    if args.wandb_mode == "disabled":
        return []
    if args.wandb_mode == "online" and not ctx.host.env.get("WANDB_API_KEY"):
        if not ctx.dry_run:  # a dry run shows it: no wandb flags
            ctx.note("wandb is off: WANDB_API_KEY is not set (--wandb-mode offline logs locally)")
        return []
    return flags(
        use_wandb=True,
        wandb_project=args.wandb_project,
        wandb_group=args.run_id,
        wandb_mode=args.wandb_mode,
    )


def execute_train(
    ctx: LaunchContext,
    args: LauncherArgs,
    train_argv: Sequence[str],
    *,
    hardware: Hardware,
    num_gpus_per_node: int,
    num_cpus: int | None = None,
    job_env: Mapping[str, str] | None = None,
    stop_ray: bool = False,
) -> None:
    """Emit the launch of ``python3 train.py <train_argv> <extra_args>`` as a Ray job.

    Without `args.ray_address` this node becomes a fresh single-node Ray head (stale processes
    cleaned first; `stop_ray` stops it after the job). With it, the job goes to that cluster
    and no process here is touched. Several nodes need such a running cluster.
    """
    host_env = ctx.host.env
    own_cluster = args.ray_address is None
    if own_cluster and args.num_nodes > 1:
        raise LaunchError(
            f"--num-nodes {args.num_nodes} needs a running Ray cluster: run `ray start --head "
            f"--port {args.ray_port}` on the head and `ray start --address HEAD:{args.ray_port} "
            f"--num-gpus {num_gpus_per_node}` on each worker, then pass --ray-address "
            f"http://HEAD:{args.dashboard_port}"
        )
    master_addr = host_env.get("MASTER_ADDR") or "127.0.0.1"
    platform = platform_env(hardware, host_env)

    if own_cluster:
        ctx.emit(ProcessCleanup(names=("sglang",), patterns=("python3 train.py",)))
        ctx.emit(
            RayStart(
                node_ip_address=master_addr,
                port=args.ray_port,
                num_gpus=num_gpus_per_node,
                num_cpus=num_cpus,
                dashboard_port=args.dashboard_port,
                env={**platform, "PYTHONUNBUFFERED": "1"},
            )
        )

    argv = [*train_argv, *args.extra_argv]
    env_vars = {
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": _join_unique(":", ctx.host.checkout, host_env.get("PYTHONPATH", "")),
        "MASTER_ADDR": master_addr,
        "no_proxy": _join_unique(
            ",", "127.0.0.1", "localhost", master_addr, host_env.get("no_proxy", "")
        ),
        **{name: host_env[name] for name in FORWARDED_ENV if name in host_env},
        **platform,
    }
    if "--use-wandb" in argv and host_env.get("WANDB_API_KEY"):
        env_vars["WANDB_API_KEY"] = host_env["WANDB_API_KEY"]
    env_vars.update(job_env or {})
    env_vars.update(args.extra_env_vars)
    address = args.ray_address or f"http://127.0.0.1:{args.dashboard_port}"
    runtime_env = {
        "env_vars": env_vars,
        "working_dir": ctx.host.checkout,
        "excludes": list(WORKING_DIR_EXCLUDES),
    }
    ctx.emit(RayJobSubmit(address, ("python3", "train.py", *argv), runtime_env))
    if own_cluster and stop_ray:
        ctx.emit(RayStop())


def _join_unique(separator: str, *parts: str) -> str:
    entries = [entry for part in parts for entry in part.split(separator) if entry]
    return separator.join(dict.fromkeys(entries))
