"""A KubeRay ``RayJob`` manifest of a launch: the run on a Ray cluster of its own on Kubernetes.

KubeRay (`KUBERAY_VERSION`) creates the RayCluster the manifest
describes, submits ``python3 train.py <argv>`` to it and deletes it when the job ends. The
pieces are those of a `train` on a cluster given by address (`harness.ray_job.execute_train`):
the same rendered argv and the same job environment, the recipe's ``job_env`` included, which
only the launcher's `train` knows. So the manifest is built from the one step that such a
`train` emits, its job submission, on a view of this host that holds what a pod holds: the
image's checkout (``--image-checkout``) and no device visibility of this host.

- The cluster: a head group and, with ``--num-nodes N``, a worker group of N - 1 replicas, each
  pod with the hardware's GPUs per node as ``nvidia.com/gpu`` or ``amd.com/gpu`` (none on a CPU),
  the launcher's CPUs per node where it says, the platform's environment (`harness.platform`)
  and the ``--pvc`` claims mounted.
- Secrets: never a value. Each secret variable of the job (`common.secrets`) is read in every
  Ray pod from the Kubernetes Secret ``<name>-secrets`` that the user creates (the manifest's
  header says how); the other variables travel in the job's runtime env.
- Ray's token authentication: ``authOptions.mode: token``; KubeRay makes a fresh token for the
  cluster in a Secret of its own and gives it to every Ray container and to the submitter.
- The paths of the argv (model, data, output) are the pods' paths: the image or a ``--pvc``
  claim must hold them.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from common.secrets import is_secret
from harness import pinned_sets
from harness.cluster_shape import ClusterShape
from harness.context import LaunchContext, check_train_argv
from harness.errors import LaunchError
from harness.launcher import LauncherArgs
from harness.platform import platform_env
from harness.steps import RayJobSubmit, WriteFile
from trainer.config.flags import option

KUBERAY_VERSION = "v1.7.0"  # the release whose RayJob the manifest is (harness.rayjob_schema)
API_VERSION = "ray.io/v1"
# KubeRay names a RayJob's RayCluster <name>-<5 characters>, a DNS-1035 label of at most 53
# characters: a RayJob's name is one of at most 47 (its ValidateRayJobMetadata).
MAX_NAME_LENGTH = 47
# token authentication's first Ray (KubeRay refuses authOptions for an older rayVersion), the
# floor of this project's ray extra; KubeRay reads it to gate features, the image says the rest
RAY_VERSION = "2.52.0"
GPU_RESOURCE = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}
NAME_PREFIX = "grpo-"
# Of this host only: a pod sees the GPUs Kubernetes gives it, its Python path is the image's,
# and its job goes to the cluster KubeRay makes.
_HOST_ONLY = (
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "PYTHONPATH",
    "no_proxy",
    "RAY_ADDRESS",
)
_KUBERAY_SUBMITS = "kuberay://its-own-cluster"  # the address of the `train` it asks: unused
_RUN_ID = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_CLAIM = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def write_rayjob(ctx: LaunchContext, args: LauncherArgs) -> None:
    """Emit the writing of ``<output-dir>/<run-id>/rayjob.yaml`` (apply it with kubectl)."""
    path = f"{args.output_dir}/{args.run_id}/rayjob.yaml"
    manifest = rayjob_manifest(ctx, args)
    ctx.emit(WriteFile(path, rayjob_yaml(ctx, args, manifest)))
    if not ctx.dry_run:
        if create := secret_command(manifest):
            ctx.note(f"create its Secret first: {create}")
        ctx.note(f"submit it with: kubectl apply -f {shlex.quote(path)}")


def rayjob_manifest(ctx: LaunchContext, args: LauncherArgs) -> dict[str, Any]:
    """The RayJob of the launch `args` (see the module's docstring)."""
    name = rayjob_name(args)
    mounts = _checked_options(ctx, args)
    cluster, submit = _job_of_train(ctx, args)
    job_env = dict(submit.runtime_env.get("env_vars", {}))
    secrets = sorted(n for n in job_env if is_secret(n))
    runtime_env = {**submit.runtime_env, "env_vars": _without(job_env, secrets)}
    pod = _pod_spec(args.image or "", cluster, mounts, secrets, f"{name}-secrets")
    return {
        "apiVersion": API_VERSION,
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "grpo-lora", "grpo-lora/run-id": args.run_id},
            "annotations": {"grpo-lora/launcher": f"{ctx.launcher.path}.py"},
        },
        "spec": {
            "entrypoint": shlex.join(submit.entrypoint),
            "runtimeEnvYAML": _dump(runtime_env),
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": _ray_cluster(cluster, pod),
        },
    }


def _checked_options(ctx: LaunchContext, args: LauncherArgs) -> dict[str, str]:
    """The ``--pvc`` mounts, once the options of a manifest are known to make one; a note for
    the directories on no claim."""
    if args.ray_address:
        raise LaunchError("rayjob makes a Ray cluster of its own; drop --ray-address")
    if not args.image or not args.image.strip() or any(c.isspace() for c in args.image):
        raise LaunchError(
            "rayjob needs --image: the container image of the Ray pods, with this checkout at "
            f"--image-checkout ({args.image_checkout}) and its Python environment"
        )
    if not args.image_checkout.startswith("/"):
        raise LaunchError(f"--image-checkout must be an absolute path ({args.image_checkout!r})")
    mounts = pvc_mounts(args.pvc)
    if unmounted := [
        option(name)
        for name in ("model_dir", "data_dir", "output_dir")
        if not any(_under(getattr(args, name), path) for path in mounts.values())
    ]:
        ctx.note(
            f"{', '.join(unmounted)} on no --pvc claim: the image must hold them, and what the "
            "run writes there goes with its pods"
        )
    return mounts


def _ray_cluster(cluster: ClusterShape, pod: dict[str, Any]) -> dict[str, Any]:
    """A head and ``nodes - 1`` workers of `pod`, with Ray's token authentication."""
    spec: dict[str, Any] = {
        "rayVersion": RAY_VERSION,
        "authOptions": {"mode": "token"},
        "headGroupSpec": {"template": {"spec": _named(pod, "ray-head")}},
    }
    if cluster.nodes > 1:
        workers = cluster.nodes - 1
        group = {"groupName": "workers", "replicas": workers}
        group |= {"minReplicas": workers, "maxReplicas": workers}
        spec["workerGroupSpecs"] = [{**group, "template": {"spec": _named(pod, "ray-worker")}}]
    return spec


def _job_of_train(ctx: LaunchContext, args: LauncherArgs) -> tuple[ClusterShape, RayJobSubmit]:
    """The cluster and the job submission of the launcher's `train` toward a cluster given by
    address, on this host as a pod sees it; its notes and hardware become `ctx`'s."""
    env = {k: v for k, v in ctx.host.env.items() if k not in _HOST_ONLY}
    pod_host = dataclasses.replace(ctx.host, env=env, checkout=args.image_checkout)
    pod = LaunchContext(ctx.launcher, pod_host, dry_run=ctx.dry_run)
    to_address = dataclasses.replace(args, ray_address=_KUBERAY_SUBMITS)
    ctx.launcher.entrypoint("train")(pod, to_address)
    ctx.notes.extend(pod.notes)
    submissions = [step for step in pod.steps if isinstance(step, RayJobSubmit)]
    if len(submissions) != 1 or len(pod.steps) != 1:
        raise TypeError(
            f"{ctx.launcher.module}: rayjob needs a `train` that, given a cluster's address, "
            f"submits one job and does nothing else (it emitted {[s.kind for s in pod.steps]})"
        )
    check_train_argv(submissions, "rayjob")
    ctx.hardware = pod.hardware
    return pod.cluster(args), submissions[0]


def _pod_spec(
    image: str,
    cluster: ClusterShape,
    mounts: Mapping[str, str],
    secrets: list[str],
    secret_name: str,
) -> dict[str, Any]:
    """A Ray pod of `cluster`: its container (unnamed) and the claims' volumes."""
    env = {**platform_env(cluster.hardware, {}), "PYTHONUNBUFFERED": "1"}
    container: dict[str, Any] = {
        "image": image,
        "env": [{"name": n, "value": v} for n, v in sorted(env.items())]
        + [
            {"name": n, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": n}}}
            for n in secrets
        ],
    }
    resources = {}
    if cluster.cpus_per_node is not None:
        resources["cpu"] = str(cluster.cpus_per_node)
    if cluster.gpus_per_node:
        resources[GPU_RESOURCE[cluster.hardware.vendor]] = str(cluster.gpus_per_node)
    if resources:
        container["resources"] = {"limits": resources, "requests": dict(resources)}
    volumes = [f"pvc-{index}" for index in range(len(mounts))]
    if mounts:
        container["volumeMounts"] = [
            {"name": volume, "mountPath": path}
            for volume, path in zip(volumes, mounts.values(), strict=True)
        ]
    spec: dict[str, Any] = {"containers": [container]}
    if mounts:
        spec["volumes"] = [
            {"name": volume, "persistentVolumeClaim": {"claimName": claim}}
            for volume, claim in zip(volumes, mounts, strict=True)
        ]
    return spec


def _named(pod: dict[str, Any], container: str) -> dict[str, Any]:
    (only,) = pod["containers"]
    return {**pod, "containers": [{"name": container, **only}]}


def _without(env: Mapping[str, str], names: list[str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in names}


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def rayjob_name(args: LauncherArgs) -> str:
    """``grpo-<run id>``: a Kubernetes name (a DNS-1035 label KubeRay can extend), so the run
    id must be one already; a run id it would have to change could name another run's job."""
    run_id = str(args.run_id)
    if not _RUN_ID.fullmatch(run_id) or len(NAME_PREFIX + run_id) > MAX_NAME_LENGTH:
        raise LaunchError(
            f"rayjob names its RayJob {NAME_PREFIX}<run id>: --run-id must be lowercase "
            f"letters, digits and '-', at most {MAX_NAME_LENGTH - len(NAME_PREFIX)} characters "
            f"({run_id!r})"
        )
    return NAME_PREFIX + run_id


def pvc_mounts(text: str) -> dict[str, str]:
    """``--pvc CLAIM:PATH[,CLAIM:PATH...]`` as {claim: mount path}."""
    mounts: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        claim, colon, path = item.partition(":")
        if not colon or not _CLAIM.fullmatch(claim) or not path.startswith("/"):
            raise LaunchError(f"--pvc items must be CLAIM:/ABSOLUTE/PATH (got {item!r})")
        if claim in mounts or path in mounts.values():
            raise LaunchError(f"--pvc names {claim!r} or {path!r} twice")
        mounts[claim] = path
    return mounts


def secret_command(manifest: Mapping[str, Any]) -> str | None:
    """The ``kubectl create secret`` of the Secret `manifest` reads, with each value from the
    variable of the same name of the shell that runs it; None when it reads none."""
    refs = {
        (env["valueFrom"]["secretKeyRef"]["name"], env["name"])
        for env in manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"][
            "containers"
        ][0]["env"]
        if "valueFrom" in env
    }
    if not refs:
        return None
    (secret,) = {name for name, _ in refs}
    literals = " ".join(f'--from-literal={key}="${key}"' for _, key in sorted(refs))
    return f"kubectl create secret generic {secret} {literals}"


def rayjob_yaml(ctx: LaunchContext, args: LauncherArgs, manifest: Mapping[str, Any]) -> str:
    """`manifest` as YAML under a header that says what it needs before it is applied."""
    header = [
        f"KubeRay {KUBERAY_VERSION} RayJob of {ctx.launcher.path}.py, run {args.run_id}.",
        f"The image holds this checkout at {args.image_checkout}; the model, data and output",
        "paths of the entrypoint are the pods' (mounted with --pvc, or in the image).",
    ]
    argv = shlex.split(manifest["spec"]["entrypoint"])
    header += [f"Pinned set of its packages: {line}" for line in pinned_sets.described(argv)]
    if create := secret_command(manifest):
        header += ["Its secrets come from a Secret of yours, never from this file:", f"  {create}"]
    header.append("Then: kubectl apply -f rayjob.yaml")
    return "".join(f"# {line}\n" for line in header) + _dump(manifest)


class _Dumper(yaml.SafeDumper):
    """Block style, every value written out (no anchors: the worker's pod repeats the head's);
    a multi-line string (the runtime env) as a literal block."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def _dump(data: Any) -> str:
    """YAML in the given key order; a long line (the entrypoint) stays one line."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=2**31, allow_unicode=True)
