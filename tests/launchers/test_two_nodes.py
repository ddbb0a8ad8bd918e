"""The CPU recipe on a simulated 2-node Ray cluster: two Ray nodes of this host, started by the
launcher's own `train --num-nodes 2` (the head) and `worker` (the other node), each with its
own temp dir, ports and one CPU; with one training rank per node (``--actor-ranks 1``) the two
ranks land one on each node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import ownership
from harness.host import CHECKOUT
from harness.run_tag import RunTag
from tests.support.private_ray import LauncherPorts, free_ports
from trainer import tiny
from trainer.run.metrics import METRICS_FILE, read_metrics

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("cpu_launcher_slot"),  # live CPU launcher runs take turns
]

MODULE = "launchers.cpu.run_tiny_qwen3_lora"
FILE = f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py"


def launcher(entrypoint: str, *argv: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", MODULE, entrypoint, *argv],
            cwd=CHECKOUT,
            env={**os.environ, "PYTHONPATH": CHECKOUT},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def train_workers(tag: RunTag, processes: list[ownership.Seen]) -> set[int]:
    return {s.process.pid for s in ownership.of_run(tag, processes) if "TrainWorker" in s.cmdline}


@pytest.mark.slow  # a minute and a half: two Ray nodes and the whole job
def test_the_cpu_recipe_trains_with_ranks_on_both_nodes(tmp_path):
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    ray_port, worker_agent_port, dashboard_port, agent_port, client_server_port = free_ports(5)
    common = [
        "--run-id", "two", "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--ray-port", str(ray_port), "--ray-num-cpus", "1", "--cluster-timeout", "90",
    ]  # fmt: skip
    head_tag, worker_tag = (RunTag(FILE + role, "cpu", "two") for role in ("", ":worker"))
    worker = launcher(
        "worker", "--head-address", "127.0.0.1", "--agent-port", str(worker_agent_port), *common,
        log=tmp_path / "worker.log",
    )  # fmt: skip
    head = launcher(
        "train", "--num-nodes", "2", "--actor-ranks", "1", "--set", "num-rollout=6",
        "--set", "save-interval=6", "--set", "eval-interval=6",
        "--dashboard-port", str(dashboard_port), "--agent-port", str(agent_port),
        "--client-server-port", str(client_server_port), *common, log=tmp_path / "head.log",
    )  # fmt: skip
    on_head: set[int] = set()
    on_worker: set[int] = set()
    try:
        deadline = time.time() + 240
        while head.poll() is None and time.time() < deadline:
            processes = ownership.processes()  # one scan of the host for both nodes
            on_head |= train_workers(head_tag, processes)
            on_worker |= train_workers(worker_tag, processes)
            time.sleep(0.5)
        status = head.wait(timeout=5)
        worker.send_signal(signal.SIGTERM)  # as scancel ends the job step on the other node
        worker_status = worker.wait(timeout=60)
        left = [
            s
            for tag in (head_tag, worker_tag)
            for s in ownership.of_run(tag, ownership.processes())
        ]
    finally:
        for process in (head, worker):
            process.kill()
        ownership.release(head_tag)
        ownership.release(worker_tag)
    head_log = (tmp_path / "head.log").read_text()
    assert status == 0, head_log[-3000:]
    assert on_head and on_worker, f"ranks on the head {on_head}, on the worker {on_worker}"
    records = read_metrics(tmp_path / "outputs" / "two" / METRICS_FILE)
    assert [r["step"] for r in records] == list(range(6))
    assert worker_status == 143, (tmp_path / "worker.log").read_text()[-3000:]
    assert left == [], "the launchers left Ray processes running"
    token = tmp_path / "outputs" / "two" / "ray" / "auth_token"
    assert not token.exists(), "the cluster's token outlives the run"


def test_a_cluster_that_never_reaches_its_size_ends_in_one_line(tmp_path):
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    argv = [
        "--num-nodes", "2", "--cluster-timeout", "2", "--run-id", "alone",
        "--model-dir", str(tmp_path / "models"), "--data-dir", str(tmp_path / "data"),
        "--output-dir", str(tmp_path / "outputs"), *LauncherPorts.draw().argv(),
        "--ray-num-cpus", "1",
    ]  # fmt: skip
    tag = RunTag(FILE, "cpu", "alone")
    started = time.monotonic()
    head = launcher("train", *argv, log=tmp_path / "head.log")
    try:
        status = head.wait(timeout=120)
        left = ownership.of_run(tag, ownership.processes())
    finally:
        head.kill()
        ownership.release(tag)
    text = (tmp_path / "head.log").read_text()
    assert status == 1, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("==> error:")]
    assert len(errors) == 1 and "has 1 of 2 nodes" in errors[0] and "after 2 s" in errors[0]
    assert "Traceback" not in text
    assert time.monotonic() - started < 90
    assert left == [], "the head's Ray was left running"
