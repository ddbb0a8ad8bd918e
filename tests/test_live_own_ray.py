"""The Ray a live launcher starts: it refuses unauthenticated jobs, its token shows nowhere,
and SIGTERM (``timeout``, ``scancel``) to the launcher stops its job and then that Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness import ownership
from harness.host import CHECKOUT
from harness.run_tag import RunTag
from tests.private_ray import free_port
from trainer import tiny

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def submit_without_token(dashboard_port: int) -> int:
    """The HTTP status of a job submission that carries no token."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{dashboard_port}/api/jobs/",
        data=json.dumps({"entrypoint": "echo pwned"}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


def test_token_auth_and_sigterm_on_the_launchers_ray(tmp_path):
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    dashboard_port = free_port()
    argv = [
        "train", "--run-id", "sigterm", "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--ray-port", str(free_port()), "--dashboard-port", str(dashboard_port),
        "--agent-port", str(free_port()),
        "--num-rollout", "1000",
    ]  # fmt: skip
    tag = RunTag(f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py", "cpu", "sigterm")
    log = tmp_path / "launcher.log"
    with log.open("w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "launchers.cpu.run_tiny_qwen3_lora", *argv],
            cwd=CHECKOUT,
            env={**os.environ, "PYTHONPATH": CHECKOUT},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.time() + 180
        while "step 1/1000" not in log.read_text():  # the job trains
            assert launcher.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert submit_without_token(dashboard_port) == 401
        token = Path(tag.token_path).read_text()
        run_processes = ownership.of_run(tag, ownership.processes())
        assert run_processes, "the job runs on the run's own Ray"
        for seen in run_processes:
            assert token not in seen.cmdline and token not in str(seen.environ)
        launcher.send_signal(signal.SIGTERM)
        status = launcher.wait(timeout=60)
        left = ownership.of_run(tag, ownership.processes())
    finally:
        launcher.kill()
        ownership.release(tag)
    text = log.read_text()
    assert status == 143, text[-3000:]
    assert "Ray job raysubmit_" in text and " stopped\n" in text
    assert text.rstrip().endswith("python -m launchers.cpu.run_tiny_qwen3_lora: error: terminated")
    assert "Traceback" not in text and token not in text
    assert left == [], "the run's Ray survives"
