"""Several nodes: Slurm's allocation in live mode only, the head's wait, the worker's wait."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness import ownership
from harness.cli import run
from harness.context import Plan, first_node
from harness.discovery import discover_launchers
from harness.host import CHECKOUT, HostView
from harness.record import record
from harness.run_tag import RunTag
from harness.steps import (
    ClaimRun,
    RayJobSubmit,
    RayStart,
    VerifyRay,
    WaitForCluster,
    WaitForHead,
    train_py_argv,
)
from launchers.amd.run_qwen3_4b_lora import LAUNCHER as AMD
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from tests.support.private_ray import free_port


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("gpu[03-05,9],cpu1", "gpu03"), ("node7,node8", "node7"), ("n[1-2]", "n1"), ("solo", "solo")],
)
def test_first_node_of_a_slurm_node_list(nodelist, first):
    assert first_node(nodelist) == first


class Spy:
    def __init__(self) -> None:
        self.plans: list[Plan] = []

    def __call__(self, plan: Plan) -> int:
        self.plans.append(plan)
        return 0


def live_host(**env: str):
    return lambda: HostView(env, "/home/u", "/repo", "/work", "run-1", lambda: "AMD MI355X")


def test_in_a_slurm_allocation_the_head_waits_for_every_node():
    spy = Spy()
    slurm = {"SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "mi[10-11]"}
    assert run(AMD, ["train", "--run-id", "r"], live=spy, host=live_host(**slurm)) == 0
    steps = spy.plans[0].steps
    assert [type(s) for s in steps] == [ClaimRun, RayStart, VerifyRay, WaitForCluster, RayJobSubmit]
    wait = steps[3]
    assert (wait.nodes, wait.gpus, wait.address) == (2, 16, "127.0.0.1:6379")
    assert steps[1].node_ip_address is None, "several nodes: bound beyond localhost"
    assert steps[1].token_path == wait.token_path == "/home/u/outputs/r/ray/auth_token"
    job = steps[4]
    assert job.entrypoint[job.entrypoint.index("--actor-num-nodes") + 1] == "2"

    spy = Spy()
    assert run(AMD, ["worker", "--run-id", "r"], live=spy, host=live_host(**slurm)) == 0
    steps = spy.plans[0].steps
    assert [type(s) for s in steps] == [ClaimRun, WaitForHead, RayStart]  # --block: SIGTERM ends it
    assert steps[1].address == "mi10:6379" and steps[2].head_address == "mi10:6379"
    assert steps[2].env["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"  # ROCm rules


MULTI_NODE = [lau for lau in discover_launchers() if "train_2_nodes" in lau.recordings]


@pytest.mark.parametrize("launcher", MULTI_NODE, ids=[lau.path for lau in MULTI_NODE])
def test_train_places_its_ranks_on_the_cluster_it_starts_and_waits_for(launcher):
    """The cluster is said once: train.py's placement flags name the nodes the head waits for
    and the GPUs each node (head or worker) gives Ray (the CPU launcher used to wait for 2
    nodes, then train on 1)."""
    steps = record(launcher, "train_2_nodes").steps
    (start,) = [s for s in steps if isinstance(s, RayStart)]
    (wait,) = [s for s in steps if isinstance(s, WaitForCluster)]
    (argv,) = [a for a in map(train_py_argv, steps) if a is not None]

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    (joined,) = [s for s in record(launcher, "worker_2_nodes").steps if isinstance(s, RayStart)]
    assert (joined.num_gpus, joined.num_cpus) == (start.num_gpus, start.num_cpus)
    assert (wait.nodes, wait.gpus) == (2, 2 * start.num_gpus)
    assert value("--actor-num-nodes") == str(wait.nodes)
    if start.num_gpus:
        assert value("--actor-num-gpus-per-node") == value("--num-gpus-per-node")
        assert value("--num-gpus-per-node") == str(start.num_gpus)
    else:
        assert value("--device") == "cpu" and value("--num-gpus-per-node") is None


@pytest.mark.usefixtures("cpu_launcher_slot")  # a worker claims the CPU launcher's slot
def test_a_worker_that_cannot_reach_the_head_ends_in_one_line_within_its_timeout(tmp_path):
    argv = [
        sys.executable, "-m", "launchers.cpu.run_tiny_qwen3_lora", "worker",
        "--head-address", "127.0.0.1", "--ray-port", str(free_port()),
        "--cluster-timeout", "3", "--run-id", "lonely", "--output-dir", str(tmp_path),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors == [errors[0]] and "did not answer within 3 s" in errors[0]
    assert "Traceback" not in done.stderr
    tag = RunTag(f"{CHECKOUT}/{CPU.path}.py:worker", "cpu", "lonely")
    assert ownership.of_run(tag, ownership.processes()) == []
