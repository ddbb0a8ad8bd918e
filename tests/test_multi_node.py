"""Several nodes: Slurm's allocation in live mode only, the head's wait, the worker's wait."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness import ownership
from harness.cli import run
from harness.context import Plan, first_node
from harness.host import CHECKOUT, HostView
from harness.run_tag import RunTag
from harness.steps import ClaimRun, RayJobSubmit, RayStart, WaitForCluster, WaitForHead
from launchers.amd.run_qwen3_4b_lora import LAUNCHER as AMD
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from tests.private_ray import free_port


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
    assert [type(s) for s in steps] == [ClaimRun, RayStart, WaitForCluster, RayJobSubmit]
    wait = steps[2]
    assert (wait.nodes, wait.gpus, wait.address) == (2, 16, "127.0.0.1:6379")
    assert steps[1].node_ip_address is None, "several nodes: bound beyond localhost"
    assert steps[1].token_path == wait.token_path == "/home/u/outputs/r/ray/auth_token"
    job = steps[3]
    assert job.entrypoint[job.entrypoint.index("--actor-num-nodes") + 1] == "2"

    spy = Spy()
    assert run(AMD, ["worker", "--run-id", "r"], live=spy, host=live_host(**slurm)) == 0
    steps = spy.plans[0].steps
    assert [type(s) for s in steps] == [ClaimRun, WaitForHead, RayStart]  # --block: SIGTERM ends it
    assert steps[1].address == "mi10:6379" and steps[2].head_address == "mi10:6379"
    assert steps[2].env["RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"] == "1"  # ROCm rules


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
