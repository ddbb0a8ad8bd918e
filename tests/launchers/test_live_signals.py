"""The CPU launcher, live, stopped from outside: Ctrl-C in its terminal, and its Ray killed
under it. Slow (a real Ray and job each): ``pytest -m slow``."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import ownership
from harness.host import CHECKOUT
from harness.run_tag import RunTag
from tests.support.live_launcher import SECRETS, launch
from tests.support.private_ray import LauncherPorts
from trainer import tiny

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

FILE = f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py"

# A job with the launcher's job's runtime env: what its driver (after `job_env.load`, as
# train.py) and its workers (Ray's setup hook) see of the secrets, as digests.
PROBE = """
import hashlib, os, ray
from trainer import job_env
def seen(name):
    return hashlib.sha256(os.environ.get(name, "").encode()).hexdigest()
job_env.load()
ray.init(address="auto")
task = ray.remote(num_cpus=0)(lambda: seen("MY_SERVICE_TOKEN"))
class Actor:
    def get(self):
        return seen("HF_TOKEN")
actor = ray.remote(num_cpus=0)(Actor).remote()
workers = ray.get(task.remote()), ray.get(actor.get.remote())
print("driver", seen("HF_TOKEN"), "task", workers[0], "actor", workers[1])
"""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def start_launcher(tmp_path: Path, run_id: str, ports: LauncherPorts) -> subprocess.Popen[bytes]:
    """`train` of `run_id` in a session of its own, as a shell starts a foreground job."""
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    log = tmp_path / "launcher.log"
    return launch(tmp_path, run_id, log, ports, "--set", "num-rollout=1000", own_session=True)


def wait_for_training(launcher: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.time() + 180
    while "step 1/1000" not in log.read_text():
        assert launcher.poll() is None, log.read_text()[-3000:]
        assert time.time() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


def probe_the_jobs_environment(tag: RunTag, dashboard_port: int, log: Path) -> str:
    from ray.job_submission import JobStatus

    from harness.job_client import TimedJobClient

    token = Path(tag.token_path).read_text()
    client = TimedJobClient(
        f"http://127.0.0.1:{dashboard_port}", headers={"Authorization": f"Bearer {token}"}
    )
    (job_id,) = re.findall(r"Ray job (raysubmit_\w+) submitted", log.read_text())
    runtime_env = client.get_job_info(job_id).runtime_env
    probe = client.submit_job(entrypoint=f"python3 -c '{PROBE}'", runtime_env=runtime_env)
    deadline = time.time() + 120
    while not (status := client.get_job_status(probe)).is_terminal():
        assert time.time() < deadline
        time.sleep(0.5)
    logs = client.get_job_logs(probe)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    return logs


def test_ctrl_c_in_a_terminal_stops_the_job_and_the_ray_within_seconds(tmp_path):
    """A terminal's Ctrl-C goes to its whole foreground process group. Ray's daemons are not
    in it: the launcher alone is interrupted, stops the job (every request with a timeout)
    and its Ray, and exits 130. Before that, the job's driver and workers see the secrets
    that no Ray log holds."""
    ports = LauncherPorts.draw()
    tag = RunTag(FILE, "cpu", "ctrl-c")
    log = tmp_path / "launcher.log"
    launcher = start_launcher(tmp_path, "ctrl-c", ports)
    try:
        wait_for_training(launcher, log)
        seen = probe_the_jobs_environment(tag, ports.dashboard, log)
        expected = (
            f"driver {digest(SECRETS['HF_TOKEN'])} task {digest(SECRETS['MY_SERVICE_TOKEN'])} "
            f"actor {digest(SECRETS['HF_TOKEN'])}"
        )
        assert expected in seen, seen[-2000:]
        daemons = [s for s in ownership.of_run(tag, ownership.processes()) if s.kind == "Ray"]
        assert daemons and all(
            os.getpgid(s.process.pid) != launcher.pid for s in daemons if s.process.is_running()
        ), "Ray's daemons are in the terminal's process group"
        os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C
        interrupted = time.monotonic()
        status = launcher.wait(timeout=60)
        took = time.monotonic() - interrupted
        left = ownership.of_run(tag, ownership.processes())
    finally:
        launcher.kill()
        ownership.release(tag)
    text = log.read_text()
    assert status == 130, text[-3000:]
    assert took < 30, f"Ctrl-C took {took:.0f} s"
    assert re.search(r"Ray job raysubmit_\w+ stopped\n", text), text[-3000:]
    assert text.rstrip().endswith("python -m launchers.cpu.run_tiny_qwen3_lora: error: interrupted")
    assert "Traceback" not in text
    assert left == [], "the run's Ray survives Ctrl-C"
    assert not Path(tag.run_dir).exists()
    print(f"Ctrl-C: exit 130 after {took:.1f} s")


def test_a_run_whose_ray_is_killed_from_outside_says_why(tmp_path):
    tag = RunTag(FILE, "cpu", "killed")
    log = tmp_path / "launcher.log"
    launcher = start_launcher(tmp_path, "killed", LauncherPorts.draw())
    try:
        wait_for_training(launcher, log)
        heads = [
            s
            for s in ownership.of_run(tag, ownership.processes())
            if s.name in ("gcs_server", "raylet") or "dashboard/dashboard.py" in s.cmdline
        ]
        assert len(heads) == 3, [s.cmdline[:80] for s in heads]
        for seen in heads:  # as the OOM killer, a node-wide `ray stop --force` or kill -9 would
            seen.process.kill()
        status = launcher.wait(timeout=90)
        left = ownership.of_run(tag, ownership.processes())
    finally:
        launcher.kill()
        ownership.release(tag)
    text = log.read_text()
    assert status == 1, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("==> error:")]
    assert len(errors) == 1, text[-3000:]
    assert "this run's Ray was stopped from outside the launcher while the job ran" in errors[0]
    assert "gcs_server, raylet, dashboard ended" in errors[0]
    assert "Traceback" not in text
    assert left == [], "the rest of the run's Ray was not released"


def test_a_killed_launcher_takes_its_job_its_ray_and_its_secrets_with_it(tmp_path):
    """SIGKILL (the OOM killer, ``kill -9``) gives the launcher no chance to clean up: the
    run's lease does it, so the job does not train on unattended and the file of the job's
    secrets and the run's token do not stay behind."""
    tag = RunTag(FILE, "cpu", "sigkill")
    log = tmp_path / "launcher.log"
    launcher = start_launcher(tmp_path, "sigkill", LauncherPorts.draw())
    try:
        wait_for_training(launcher, log)
        assert Path(tag.run_dir, "job_env").exists() and Path(tag.token_path).exists()
        launcher.kill()
        launcher.wait(timeout=10)
        killed = time.monotonic()
        while (left := ownership.of_run(tag, ownership.processes())) or Path(tag.run_dir).exists():
            assert time.monotonic() - killed < 60, [s.cmdline[:80] for s in left]
            time.sleep(0.5)
        took = time.monotonic() - killed
        metrics = tmp_path / "outputs" / "sigkill" / "metrics.jsonl"
        logged = metrics.read_text()
        time.sleep(3)
        assert metrics.read_text() == logged, "the job trains on"
    finally:
        launcher.kill()
        ownership.release(tag)
    print(f"SIGKILL: the run released {took:.1f} s after its launcher died")
