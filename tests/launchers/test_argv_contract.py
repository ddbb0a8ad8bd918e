"""The argv contract: every train.py argv a launcher submits parses with train.py's own parser."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from harness import LaunchContext, Launcher, LauncherArgs, LaunchError, RayJobSubmit, build_plan
from harness.discovery import discover_launchers

LAUNCHERS = discover_launchers()
VARIANTS = {
    "defaults": {},
    "offline wandb, no eval": {"wandb_mode": "offline", "enable_eval": False},
    "two nodes on a running cluster": {"num_nodes": 2, "ray_address": "http://10.0.0.1:8265"},
    "explicit GPU count": {"num_gpus_per_node": 4},
    "extra args": {"extra_args": "--seed 7 --rollout-top-p 0.9"},
}
CASES = [
    (launcher, name, variant)
    for launcher in LAUNCHERS
    for name in launcher.entrypoint_names
    for variant in VARIANTS
    # a worker starts Ray, a rayjob has KubeRay start one
    if not (name in ("worker", "rayjob") and "ray_address" in VARIANTS[variant])
]


def variant_args(launcher: Launcher, variant: str) -> LauncherArgs:
    known = {f.name for f in dataclasses.fields(launcher.args)}
    values = {k: v for k, v in VARIANTS[variant].items() if k in known}
    values.setdefault("head_address", "10.0.0.1")  # what a worker needs
    values.setdefault("image", "registry.example.com/grpo-lora:1")  # what a rayjob needs
    if launcher.recorded_hardware == "CPU":
        values.pop("num_gpus_per_node", None)
    return launcher.args(**values)


@pytest.mark.parametrize(
    ("launcher", "entrypoint", "variant"),
    CASES,
    ids=[f"{lau.path}:{name}:{variant}" for lau, name, variant in CASES],
)
def test_every_train_argv_parses(launcher, entrypoint, variant):
    """`build_plan` holds every train.py argv to train.py's own parser (`check_train_argv`,
    which the tests below show failing)."""
    try:
        build_plan(launcher, entrypoint, variant_args(launcher, variant))
    except LaunchError as err:
        pytest.fail(f"{launcher.path} {entrypoint} ({variant}): {err}")


@dataclass(frozen=True)
class RenamedFlagArgs(LauncherArgs):
    hardware: Literal["CPU"] = "CPU"
    flag: str = "--lora-rnk"


def submit(ctx: LaunchContext, args: RenamedFlagArgs) -> None:
    argv = ("python3", "train.py", "--hf-checkpoint", "/m", "--prompt-data", "/d", args.flag, "8")
    ctx.emit(RayJobSubmit("http://127.0.0.1:8265", argv))


LAUNCHER = Launcher(__name__, args=RenamedFlagArgs, entrypoints=(submit,), recorded_hardware="CPU")


def test_a_flag_train_py_does_not_know_fails_the_plan_naming_it():
    with pytest.raises(LaunchError, match=r"submit: train.py would reject .*--lora-rnk"):
        build_plan(LAUNCHER, "submit")
    assert build_plan(LAUNCHER, "submit", RenamedFlagArgs(flag="--lora-rank")).steps


def test_a_secret_flag_is_rejected():
    with pytest.raises(LaunchError, match="--wandb-key is not accepted"):
        build_plan(LAUNCHER, "submit", RenamedFlagArgs(flag="--wandb-key"))
