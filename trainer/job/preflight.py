"""Job-start preflight: report what this process sees, stop early on what cannot work.

`run` prints torch and its GPU runtime (ROCm/HIP or CUDA), the versions of SGLang,
Megatron-core, Megatron-Bridge, Transformer Engine, transformers, peft and Ray, the device
names, and the visible-device variables; then it raises `PreflightError` (one line; the caller
prints it and exits 2) when a selected backend's package is missing or the visible devices
disagree with the job: fewer GPUs than expected, no GPU for a GPU backend, or (ROCm) HIP, CUDA
and ROCR visible-device lists that contradict each other.

Only ``importlib.metadata`` and ``find_spec`` look at the backends: SGLang and Megatron are never
imported here. Torch is (it reports the devices).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainer.backends import registry
from trainer.config import PlacementConfig

REPORTED = (
    "torch", "sglang", "megatron-core", "megatron-bridge", "transformer-engine",
    "transformers", "peft", "ray",
)  # fmt: skip
VISIBLE_VARS = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
_DISTRIBUTION_ALIASES = {"transformer-engine": ("transformer-engine", "transformer_engine")}


class PreflightError(RuntimeError):
    """A reason the job cannot run here (one line)."""


@dataclass(frozen=True)
class Environment:
    versions: Mapping[str, str | None]  # distribution -> version (None: not installed)
    modules: Mapping[str, bool]  # extra import names a backend needs -> importable
    runtime: str | None  # "ROCm (HIP 7.2.x)", "CUDA 12.8", or None for a CPU-only torch
    hip: bool  # torch is a ROCm build
    devices: tuple[str, ...]  # names of the GPUs torch sees, in index order
    visible: Mapping[str, str | None]  # VISIBLE_VARS -> value (None: unset)


def installed_version(distribution: str) -> str | None:
    """The version of `distribution` installed in this Python, or None."""
    for name in _DISTRIBUTION_ALIASES.get(distribution, (distribution,)):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def probe(environ: Mapping[str, str] | None = None) -> Environment:
    """What this process sees (imports torch when it is installed)."""
    environ = os.environ if environ is None else environ
    specs = (*registry.TRAIN_BACKENDS.values(), *registry.ROLLOUT_BACKENDS.values())
    wanted = {d for spec in specs for d in spec.packages} | set(REPORTED)
    versions = {name: installed_version(name) for name in sorted(wanted)}
    modules = {m: importlib.util.find_spec(m) is not None for spec in specs for m in spec.modules}
    runtime, hip, devices = None, False, ()
    if versions["torch"] is not None:
        import torch

        hip = bool(torch.version.hip)
        if hip:
            runtime = f"ROCm (HIP {torch.version.hip})"
        elif torch.version.cuda:
            runtime = f"CUDA {torch.version.cuda}"
        if torch.cuda.is_available():
            devices = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    visible = {var: environ.get(var) for var in VISIBLE_VARS}
    return Environment(versions, modules, runtime, hip, devices, visible)


def report(env: Environment, placement: PlacementConfig) -> list[str]:
    torch_line = f"torch {env.versions.get('torch') or 'not installed'}"
    torch_line += f", {env.runtime or 'CPU-only build'}"
    if env.devices:
        names = sorted(set(env.devices))
        torch_line += f"; {len(env.devices)} device(s): {', '.join(names)}"
    else:
        torch_line += "; no GPU visible"
    packages = ", ".join(f"{n} {env.versions.get(n) or 'not installed'}" for n in REPORTED[1:])
    visible = ", ".join(
        f"{var}={'(unset)' if env.visible[var] is None else env.visible[var]}"
        for var in VISIBLE_VARS
    )
    return [
        f"preflight: backends: train {placement.train_backend}, "
        f"rollout {placement.rollout_backend}",
        f"preflight: {torch_line}",
        f"preflight: {packages}",
        f"preflight: {visible}",
    ]


def _device_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def problems(placement: PlacementConfig, env: Environment, expected_devices: int) -> list[str]:
    """Everything that stops the job, most basic first (empty: go)."""
    found: list[str] = []
    train = registry.train_spec(placement.train_backend)
    rollout = registry.rollout_spec(placement.rollout_backend)
    for flag, spec in (("--train-backend", train), ("--rollout-backend", rollout)):
        missing = [p for p in spec.packages if env.versions.get(p) is None]
        missing += [m for m in spec.modules if not env.modules.get(m)]
        if missing:
            found.append(
                f"{flag} {spec.name} needs {', '.join(missing)}, not installed in this Python"
            )
    if found:
        return found

    wants_gpu = placement.device == "cuda" or train.needs_gpu or rollout.needs_gpu
    if not wants_gpu:
        return found
    hip, cuda, rocr = (_device_list(env.visible[v]) for v in VISIBLE_VARS)
    if env.hip and hip is not None and cuda is not None and hip != cuda:
        found.append(
            f"HIP_VISIBLE_DEVICES={','.join(hip)} and CUDA_VISIBLE_DEVICES={','.join(cuda)} "
            "disagree; on ROCm set one list (the launchers copy HIP_VISIBLE_DEVICES into "
            "CUDA_VISIBLE_DEVICES)"
        )
    selected = hip if env.hip and hip is not None else cuda
    if env.hip and rocr is not None and selected is not None:
        beyond = [d for d in selected if not d.isdigit() or int(d) >= len(rocr)]
        if beyond:
            found.append(
                f"visible device(s) {','.join(beyond)} do not exist among the "
                f"{len(rocr)} GPU(s) of ROCR_VISIBLE_DEVICES={','.join(rocr)}"
            )
    if not env.devices:
        found.append(
            f"no GPU visible to torch ({env.runtime or 'a CPU-only torch build'}) but "
            f"--train-backend {placement.train_backend} / --rollout-backend "
            f"{placement.rollout_backend} with --device {placement.device} need GPUs"
        )
    elif len(env.devices) < expected_devices:
        shown = ", ".join(
            f"{v}={env.visible[v]}" for v in VISIBLE_VARS if env.visible[v] is not None
        )
        found.append(
            f"the job was given {expected_devices} GPU(s) per node (--actor-num-gpus-per-node) "
            f"but this process sees {len(env.devices)}" + (f" ({shown})" if shown else "")
        )
    return found


def run(
    placement: PlacementConfig,
    *,
    expected_devices: int | None = None,
    environ: Mapping[str, str] | None = None,
    emit: Callable[[str], None] = print,
) -> Environment:
    """Print the report; raise `PreflightError` with the first problem.

    `expected_devices` defaults to ``--actor-num-gpus-per-node`` (a process that drives the
    whole node); a worker that drives one GPU passes 1.
    """
    env = probe(environ)
    for line in report(env, placement):
        emit(line)
    if expected_devices is None:
        expected_devices = placement.actor_num_gpus_per_node
    found = problems(placement, env, expected_devices)
    if found:
        raise PreflightError(found[0])
    return env
