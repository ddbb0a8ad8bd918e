"""A training launch: `execute_train` (claim, ``ray start``, the job), `join_cluster` (a
worker)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common.secrets import is_secret
from harness.cluster_shape import ClusterShape
from harness.context import LaunchContext
from harness.errors import LaunchError
from harness.hardware import Hardware
from harness.launcher import LauncherArgs
from harness.platform import platform_env
from harness.run_config import run_config
from harness.run_tag import RunTag
from harness.steps import (
    ClaimRun,
    RayJobSubmit,
    RayStart,
    RayStop,
    VerifyRay,
    WaitForCluster,
    WaitForHead,
    job_env_path,
)
from trainer.arguments import render
from trainer.job_env import ENV_FILE_VAR, SETUP_HOOK

# Host variables a job needs when the host sets them: network interfaces, NCCL debugging, Hub
# access, the wandb entity. Secrets among them (HF_TOKEN) travel only to the job (see
# `execute_train`).
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
# A run from a bundle (--from-bundle) reads its models and data sets there alone: the Hub's
# clients must not reach for the network (an air-gapped node would wait on its timeouts).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
LOCALHOST = "127.0.0.1"
# Ray uploads the checkout as the job's working_dir; it honours .gitignore, not these.
WORKING_DIR_EXCLUDES = (".git", ".venv")


def execute_train(
    ctx: LaunchContext,
    args: LauncherArgs,
    *,
    job_env: Mapping[str, str] | None = None,
    stop_ray: bool = False,
) -> None:
    """Emit the launch of ``python3 train.py <argv>`` as a Ray job, where the argv renders the
    launch's training config (`harness.run_config`: the recipe's, its ``--set`` settings, its
    tracking and the cluster's placement).

    Without a cluster address (``--ray-address``, else ``RAY_ADDRESS``) this node becomes a
    fresh Ray head under a run tag, with Ray's token authentication (a fresh token per run, in
    a file): what an earlier run of this launcher on these devices left is stopped first, and
    `stop_ray` stops this run's Ray after the job. A single-node head binds to localhost; with
    ``--num-nodes N`` it binds to the node's address, keeps the token where the workers can
    read it (the run's output dir, on a shared file system) and waits until `worker` has
    joined every other node. With an address the job goes to that cluster and no process here
    is started or stopped.

    The cluster (`LaunchContext.cluster`) is resolved here, once: the ``ray start``, the wait
    for its nodes and train.py's placement all derive from it.

    Secret variables (`common.secrets`) of the job's environment go, on a Ray of this run's
    own, into a private file beside its token that the runtime env names (`trainer.job_env`):
    Ray logs a runtime env's variables in clear text. A cluster given by address gets them as
    variables.
    """
    cluster = ctx.cluster(args)
    address = args.ray_address or ctx.host.env.get("RAY_ADDRESS") or None
    own_cluster = address is None
    several = cluster.nodes > 1
    if address and not args.ray_address:
        ctx.note(f"RAY_ADDRESS is set: submitting to {address}; no Ray is started or stopped")
    platform = platform_env(cluster.hardware, ctx.host.env)
    tag = run_tag(ctx, args, cluster.hardware)
    token_path = cluster_token_path(args) if several else tag.token_path
    if own_cluster:
        _start_head(ctx, args, cluster, str(tag), token_path, platform)

    argv = render(run_config(ctx, args, cluster))
    # Only a single-node cluster of this node's own is known to be here.
    local = own_cluster and not several
    env_vars = _job_env_vars(ctx, args, argv, platform, job_env or {}, local_head=local)
    checkout = ctx.host.checkout
    runtime_env: dict[str, Any] = {"working_dir": checkout, "excludes": list(WORKING_DIR_EXCLUDES)}
    secret_env = {}
    if own_cluster:  # secrets go to a private file, since Ray logs a runtime env's variables
        secret_env = {name: env_vars.pop(name) for name in list(env_vars) if is_secret(name)}
    if secret_env:
        env_vars[ENV_FILE_VAR] = job_env_path(token_path)
        runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    runtime_env["env_vars"] = env_vars
    job_address = address or f"http://{LOCALHOST}:{args.dashboard_port}"
    job_token, job_tag = (token_path, str(tag)) if own_cluster else (None, None)
    entrypoint = ("python3", "train.py", *argv)
    ctx.emit(RayJobSubmit(job_address, entrypoint, runtime_env, job_token, secret_env, job_tag))
    if own_cluster and stop_ray:
        ctx.emit(RayStop(str(tag), checkout))


def _start_head(
    ctx: LaunchContext,
    args: LauncherArgs,
    cluster: ClusterShape,
    tag: str,
    token_path: str,
    platform: Mapping[str, str],
) -> None:
    """Emit the claim of this node, the ``ray start`` of its head and, with several nodes, the
    wait until the cluster has them all."""
    checkout = ctx.host.checkout
    several = cluster.nodes > 1
    ports = (args.ray_port, args.dashboard_port, args.agent_port, args.client_server_port)
    ctx.emit(ClaimRun(tag, checkout, ports=ports, token_path=token_path))
    ctx.emit(
        RayStart(
            node_ip_address=None if several else LOCALHOST,
            port=args.ray_port,
            num_gpus=cluster.gpus_per_node,
            num_cpus=cluster.cpus_per_node,
            dashboard_port=args.dashboard_port,
            env={**platform, "PYTHONUNBUFFERED": "1"},
            tag=tag,
            token_path=token_path,
            agent_port=args.agent_port,
            client_server_port=args.client_server_port,
        )
    )
    ctx.emit(VerifyRay(tag, checkout, ports))
    if several:
        gcs = f"{LOCALHOST}:{args.ray_port}"
        timeout = args.cluster_timeout
        ctx.emit(WaitForCluster(gcs, cluster.nodes, cluster.gpus, timeout, token_path, checkout))


def _job_env_vars(
    ctx: LaunchContext,
    args: LauncherArgs,
    argv: Sequence[str],
    platform: Mapping[str, str],
    job_env: Mapping[str, str],
    *,
    local_head: bool,
) -> dict[str, str]:
    """The job's environment, secrets included: the checkout on PYTHONPATH, the forwarded host
    variables, the platform's, the wandb key where wandb logs, the Hub offline for a run from a
    bundle, then the recipe's `job_env` and the user's ``--extra-env`` and ``--pass-env`` (each
    wins over what comes before it)."""
    host_env = ctx.host.env
    env_vars = {
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": _join_unique(":", ctx.host.checkout, host_env.get("PYTHONPATH", "")),
        **({"MASTER_ADDR": LOCALHOST} if local_head else {}),
        "no_proxy": _join_unique(",", LOCALHOST, "localhost", host_env.get("no_proxy", "")),
        **{name: host_env[name] for name in FORWARDED_ENV if name in host_env},
        **platform,
    }
    if "--use-wandb" in argv and host_env.get("WANDB_API_KEY"):
        env_vars["WANDB_API_KEY"] = host_env["WANDB_API_KEY"]
    if args.from_bundle is not None:
        env_vars.update(OFFLINE_ENV)
    env_vars.update(job_env)
    env_vars.update(args.extra_env_vars)
    for name in args.pass_env_names:
        if name not in host_env:
            raise LaunchError(f"--pass-env {name}: it is not set in this environment")
        env_vars[name] = host_env[name]
    return env_vars


def join_cluster(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Emit what a worker node runs: wait for the head, then ``ray start --address HEAD``.

    The worker gets the same platform environment as the head (the ROCm rules included), runs
    under its own run tag (its own earlier run on these devices is stopped first) and uses
    the head's token from the run's output dir. ``ray start --block`` keeps it in the cluster
    until it is stopped (SIGTERM, or the end of its Slurm job): the live runner then releases
    the node's Ray, as after any failure.
    """
    if args.head_address is None:
        raise LaunchError("worker needs --head-address (the head node), or a Slurm allocation")
    if args.ray_address or ctx.host.env.get("RAY_ADDRESS"):
        raise LaunchError("worker starts a node of a new cluster; drop --ray-address/RAY_ADDRESS")
    cluster = ctx.cluster(args)
    hardware = cluster.hardware
    tag = str(run_tag(ctx, args, hardware, role="worker"))
    checkout = ctx.host.checkout
    head = f"{args.head_address}:{args.ray_port}"
    token_path = cluster_token_path(args)
    ctx.emit(ClaimRun(tag, checkout, ports=(args.agent_port,)))
    ctx.emit(WaitForHead(head, args.cluster_timeout, token_path, checkout))
    ctx.emit(
        RayStart(
            node_ip_address=None,
            num_gpus=cluster.gpus_per_node,
            head=False,
            head_address=head,
            num_cpus=cluster.cpus_per_node,
            env={**platform_env(hardware, ctx.host.env), "PYTHONUNBUFFERED": "1"},
            tag=tag,
            token_path=token_path,
            block=True,
            agent_port=args.agent_port,
        )
    )


def cluster_token_path(args: LauncherArgs) -> str:
    """The token of a multi-node run: in its output dir, which every node must see."""
    return f"{args.output_dir}/{args.run_id}/ray/auth_token"


def run_tag(ctx: LaunchContext, args: LauncherArgs, hardware: Hardware, role: str = "") -> RunTag:
    """This run's tag: the launcher's file in this checkout (with ``:worker`` on a worker
    node), the devices it asks for (``cpu``, ids, ``all``), and the run id. Another checkout's
    launcher is another launcher."""
    if hardware.device == "cpu":
        devices = "cpu"
    else:
        devices = ctx.host.visible_device_ids(hardware.vendor) or "all"
    launcher = f"{ctx.host.checkout}/{ctx.launcher.path}.py{':' + role if role else ''}"
    return RunTag(launcher, devices, str(args.run_id))


def _join_unique(separator: str, *parts: str) -> str:
    entries = [entry for part in parts for entry in part.split(separator) if entry]
    return separator.join(dict.fromkeys(entries))
