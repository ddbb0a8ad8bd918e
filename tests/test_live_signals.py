"""SIGTERM (``timeout``, ``scancel``) to a live launcher: its Ray job is stopped, its Ray too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from harness import ownership
from harness.host import CHECKOUT
from harness.run_tag import RunTag
from tests.private_ray import free_port
from trainer import tiny

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


def test_sigterm_stops_the_ray_job_and_the_ray_of_the_run(tmp_path):
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    argv = [
        "train", "--run-id", "sigterm", "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        "--ray-port", str(free_port()), "--dashboard-port", str(free_port()),
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
        launcher.send_signal(signal.SIGTERM)
        status = launcher.wait(timeout=60)
    finally:
        launcher.kill()
        ownership.release(tag)
    text = log.read_text()
    assert status == 143, text[-3000:]
    assert "Ray job raysubmit_" in text and " stopped\n" in text
    assert text.rstrip().endswith("python -m launchers.cpu.run_tiny_qwen3_lora: error: terminated")
    assert "Traceback" not in text
    assert ownership.of_run(tag, ownership.processes()) == [], "the run's Ray survives"
