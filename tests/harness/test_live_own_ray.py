"""The Ray a live launcher starts: it refuses unauthenticated jobs, its token shows nowhere,
another local user can neither read nor replace its files, its secrets are in no Ray log, a
second run of the launcher on its devices refuses instead of killing it, and SIGTERM
(``timeout``, ``scancel``) to the launcher stops its job and then that Ray and nothing else
(not a ``tail -f`` of its log, not a shell in its logs dir)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import psutil
import pytest

from harness import ownership
from harness.host import CHECKOUT
from harness.run_tag import RunTag
from tests.support.live_launcher import SECRETS, launch
from tests.support.private_ray import LauncherPorts
from trainer import tiny

pytestmark = [
    pytest.mark.ray,
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("cpu_launcher_slot"),  # live CPU launcher runs take turns
]


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


def routable_address() -> str:
    """An address of this node other than loopback, as a network peer reaches it (loopback
    where it has none)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return "127.0.0.1"


def gcs_status(address: str, token: str | None) -> grpc.StatusCode:
    """The status of a GCS request (the cluster id) sent with `token`, or with none."""
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), metadata=metadata, timeout=10)
        except grpc.RpcError as err:
            return err.code()
    return grpc.StatusCode.OK


NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")  # another local user


def as_nobody(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, "sh", "-c", command], capture_output=True, text=True)


def test_token_auth_and_sigterm_on_the_launchers_ray(tmp_path):
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    ports = LauncherPorts.draw()
    tag = RunTag(f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py", "cpu", "sigterm")
    log = tmp_path / "launcher.log"
    users_token = "a-token-of-the-users-shell"  # exported for another cluster: not this run's
    launcher = launch(
        tmp_path,
        "sigterm",
        log,
        ports,
        "--set",
        "num-rollout=1000",
        env={"RAY_AUTH_TOKEN": users_token},
    )
    bystanders: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.time() + 180
        while "step 1/1000" not in log.read_text():  # the job trains
            assert launcher.poll() is None, log.read_text()[-3000:]
            assert time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert submit_without_token(ports.dashboard) == 401
        token = Path(tag.token_path).read_text()
        run_processes = ownership.of_run(tag, ownership.processes())
        assert run_processes, "the job runs on the run's own Ray"
        hidden = (token, users_token, *SECRETS.values())
        for (
            seen
        ) in run_processes:  # argv and /proc/PID/environ: readable by any process of the user
            assert not any(value in seen.cmdline or value in str(seen.environ) for value in hidden)

        # A network peer reaches the GCS (Ray binds it on every interface) and is refused
        # without the token.
        address = f"{routable_address()}:{ports.ray}"
        assert gcs_status(address, None) == grpc.StatusCode.UNAUTHENTICATED
        assert gcs_status(address, users_token) == grpc.StatusCode.UNAUTHENTICATED
        assert gcs_status(address, token) == grpc.StatusCode.OK

        # Another local user: the run's dir is private, though Ray made its own dir 0777.
        run_dir = Path(tag.run_dir)
        assert Path(tag.temp_dir).parent == run_dir and Path(tag.token_path).parent == run_dir
        info = run_dir.lstat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.geteuid(), 0o700)
        assert stat.S_IMODE(Path(tag.token_path).stat().st_mode) == 0o600
        logs = run_dir / "r" / "session_latest" / "logs"
        agent_log = logs / "runtime_env_agent.log"
        assert "Creating runtime env" in agent_log.read_text()
        for attack in (
            f"cat {tag.token_path}",
            f"echo known > {tag.token_path}",
            f"mv {run_dir}/r {run_dir}/r.old",
            f"ls {run_dir}",
            f"cat {agent_log}",
        ):
            assert as_nobody(attack).returncode != 0, f"another user could: {attack}"
        assert Path(tag.token_path).read_text() == token

        # The secrets reached the job through a private file, and no Ray file holds them.
        holders = sorted(
            str(path.relative_to(run_dir))
            for path in run_dir.rglob("*")
            if path.is_file()
            and any(value.encode() in path.read_bytes() for value in SECRETS.values())
        )
        assert holders == ["job_env"], "a secret in clear text outside the job's own file"
        assert stat.S_IMODE((run_dir / "job_env").stat().st_mode) == 0o600

        # A second run of the launcher on the same devices refuses, naming this one.
        second = launch(tmp_path, "second", tmp_path / "second.log", LauncherPorts.draw())
        assert second.wait(timeout=120) == 1
        refusal = (tmp_path / "second.log").read_text()
        errors = [line for line in refusal.splitlines() if "error" in line]
        assert len(errors) == 1 and "run 'sigterm' (launcher pid " in errors[0], refusal[-2000:]
        assert "in progress" in errors[0] and "Traceback" not in refusal
        steps = log.read_text().count("\nstep ")
        while log.read_text().count("\nstep ") < steps + 2:  # the first run trains on
            assert launcher.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)

        # What only looks at the run's files is not the run's.
        bystanders.append(subprocess.Popen(["tail", "-f", str(logs / "raylet.out")]))
        bystanders.append(subprocess.Popen(["sleep", "600"], cwd=logs))
        launcher.send_signal(signal.SIGTERM)
        status = launcher.wait(timeout=60)
        left = ownership.of_run(tag, ownership.processes())
        survivors = [process.poll() is None for process in bystanders]
    finally:
        launcher.kill()
        ownership.release(tag)
        for process in bystanders:
            process.kill()
            process.wait()
    text = log.read_text()
    assert status == 143, text[-3000:]
    assert "Ray job raysubmit_" in text and " stopped\n" in text
    assert text.rstrip().endswith("python -m launchers.cpu.run_tiny_qwen3_lora: error: terminated")
    assert "Traceback" not in text and token not in text
    assert not any(value in text for value in SECRETS.values())
    assert left == [], "the run's Ray survives"
    assert survivors == [True, True], "a tail -f of the run's log or a shell in it was killed"
    assert not run_dir.exists(), "the run's private dir outlives it"
