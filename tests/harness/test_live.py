"""Live execution of steps, without touching Ray or the Hub: real subprocesses in a temp dir,
a fake Hub download function and a fake Ray job client."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from ray.job_submission import JobStatus

from harness import ownership
from harness.context import Plan
from harness.errors import Terminated
from harness.hardware import get_hardware
from harness.host import CHECKOUT, HostView
from harness.live import StepFailed, execute_plan, live_env, run_job, run_step
from harness.run_tag import TAG_VAR, RunTag
from harness.steps import ClaimRun, HubDownload, RayJobSubmit, RayStart, RayStop, Shell, Step
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from tests.support.listening import another_user_or_skip, http_server
from tests.support.private_ray import free_port


def plan_of(*steps: Step, env: dict[str, str] | None = None) -> Plan:
    host = HostView(env if env is not None else dict(os.environ), "/h", "/c", "/c", "r")
    return Plan(CPU, "train", get_hardware("CPU"), host, steps)


def test_live_env_puts_this_interpreter_first_on_path():
    env = live_env({"PATH": "/usr/bin:/bin", "X": "1"})
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    assert env["X"] == "1"


def test_shell_runs_in_its_cwd_with_its_env_and_the_interpreter_as_python3(tmp_path):
    script = (
        "import os, sys; open('out.txt', 'w').write(os.environ['GREETING'] + ' ' + sys.executable)"
    )
    step = Shell(("python3", "-c", script), cwd=str(tmp_path), env={"GREETING": "hi"})
    assert execute_plan(plan_of(step)) == 0
    greeting, executable = (tmp_path / "out.txt").read_text().split(" ", 1)
    assert greeting == "hi"
    assert os.path.dirname(executable) == os.path.dirname(sys.executable)


def test_a_failing_step_stops_the_plan_with_its_exit_code(tmp_path):
    fail = Shell(("python3", "-c", "raise SystemExit(7)"))
    never = Shell(("python3", "-c", "open('never', 'w')"), cwd=str(tmp_path))
    assert execute_plan(plan_of(fail, never)) == 7
    assert not (tmp_path / "never").exists()


def test_a_missing_program_is_a_failed_step():
    with pytest.raises(StepFailed, match="no-such-program-xyz"):
        run_step(Shell(("no-such-program-xyz",)), live_env())


TAG = "launchers.cpu.run_tiny_qwen3_lora@cpu/r"
START = RayStart("127.0.0.1", num_gpus=0, tag=TAG)
JOB_STEP = RayJobSubmit("http://127.0.0.1:8265", ("python3", "train.py"))
STOP = RayStop(TAG, "/c")


def runner(ran: list[Step], fail_on: type[Step], error: BaseException):
    def run(step: Step, env) -> None:
        ran.append(step)
        if isinstance(step, fail_on):
            raise error

    return run


@pytest.mark.parametrize(
    "error",
    [StepFailed("job failed", 5), RuntimeError("lost the job server"), ConnectionError()],
    ids=["step-failed", "any-exception", "no-message"],
)
def test_a_failure_after_ray_started_stops_that_ray_in_one_line(error, capsys):
    ran: list[Step] = []
    status = execute_plan(
        plan_of(START, JOB_STEP, Shell(("true",))), runner(ran, RayJobSubmit, error)
    )
    assert status == (5 if isinstance(error, StepFailed) else 1)
    assert ran == [START, JOB_STEP, STOP]
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in errors[0]


def test_a_failed_download_stops_no_ray_when_none_was_started():
    ran: list[Step] = []
    download = HubDownload("Qwen/Qwen3-4B", "/m")
    plan = plan_of(download, START, JOB_STEP, STOP)
    assert execute_plan(plan, runner(ran, HubDownload, StepFailed("offline"))) == 1
    assert ran == [download]


def test_ctrl_c_stops_the_started_ray_once():
    ran: list[Step] = []
    with pytest.raises(KeyboardInterrupt):
        execute_plan(plan_of(START, JOB_STEP, STOP), runner(ran, RayJobSubmit, KeyboardInterrupt()))
    assert ran == [START, JOB_STEP, STOP]
    ran.clear()
    assert execute_plan(plan_of(START, STOP, JOB_STEP), runner(ran, RayJobSubmit, StepFailed("x")))
    assert ran == [START, STOP, JOB_STEP], "a Ray already stopped is not stopped twice"


def test_sigterm_takes_the_ctrl_c_path():
    ran: list[Step] = []

    def run(step: Step, env) -> None:
        ran.append(step)
        if isinstance(step, RayJobSubmit):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the signal interrupts this

    started = time.monotonic()
    with pytest.raises(Terminated):
        execute_plan(plan_of(START, JOB_STEP, STOP), run)
    assert time.monotonic() - started < 4
    assert ran == [START, JOB_STEP, STOP]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_hangup_takes_the_ctrl_c_path_too():
    """Ray's daemons outlive the terminal (their own session): a launcher that the terminal's
    SIGHUP ends stops its job and its Ray first."""
    ran: list[Step] = []

    def run(step: Step, env) -> None:
        ran.append(step)
        if isinstance(step, RayJobSubmit):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(5)  # the signal interrupts this

    unhandled: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: unhandled.append(signum))
    try:
        with pytest.raises(Terminated) as stopped:
            execute_plan(plan_of(START, JOB_STEP, STOP), run)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert stopped.value.signum == signal.SIGHUP and unhandled == []
    assert ran == [START, JOB_STEP, STOP]


def test_a_second_ctrl_c_does_not_cut_the_cleanup_short():
    ran: list[Step] = []

    def run(step: Step, env) -> None:
        ran.append(step)
        if isinstance(step, RayJobSubmit):
            raise KeyboardInterrupt
        if isinstance(step, RayStop):
            os.kill(os.getpid(), signal.SIGINT)  # pressed again while the Ray is stopped
            time.sleep(0.2)
            ran.append(step)  # reached: the stop went on

    before = signal.getsignal(
        signal.SIGINT
    )  # SIG_IGN where a shell started the tests in the background
    with pytest.raises(KeyboardInterrupt):
        execute_plan(plan_of(START, JOB_STEP, STOP), run)
    assert ran == [START, JOB_STEP, STOP, STOP]
    assert signal.getsignal(signal.SIGINT) is before  # the handler that was there is back


def test_hub_download_uses_snapshot_download(monkeypatch):
    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda **kw: calls.append(kw))
    run_step(HubDownload("zhuzilin/aime-2024", "/d/aime", "dataset", ("*.jsonl",)), {})
    run_step(HubDownload("Qwen/Qwen3-4B", "/m/q"), {})
    assert calls == [
        {
            "repo_id": "zhuzilin/aime-2024",
            "repo_type": "dataset",
            "revision": None,
            "local_dir": "/d/aime",
            "allow_patterns": ["*.jsonl"],
        },
        {
            "repo_id": "Qwen/Qwen3-4B",
            "repo_type": "model",
            "revision": None,
            "local_dir": "/m/q",
            "allow_patterns": None,
        },
    ]


def test_a_failed_download_is_a_failed_step(monkeypatch):
    def offline(**kw):
        raise OSError("no network")

    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    with pytest.raises(StepFailed, match="downloading Qwen/Qwen3-4B: no network"):
        run_step(HubDownload("Qwen/Qwen3-4B", "/m/q"), {})


@dataclass
class FakeInfo:
    driver_exit_code: int | None
    message: str


class FakeJobClient:
    """Stands in for ray.job_submission.JobSubmissionClient."""

    def __init__(self, statuses: list[JobStatus], exit_code: int | None = None, interrupt=False):
        self.statuses = statuses
        self.exit_code = exit_code
        self.interrupt = interrupt
        self.submitted: dict = {}
        self.stopped: list[str] = []

    def submit_job(self, *, entrypoint: str, runtime_env: dict) -> str:
        self.submitted = {"entrypoint": entrypoint, "runtime_env": runtime_env}
        return "raysubmit_1"

    async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        yield "step 1\n"
        if self.interrupt:
            raise KeyboardInterrupt
        yield "step 2\n"

    def get_job_status(self, job_id: str) -> JobStatus:
        return self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]

    def get_job_info(self, job_id: str) -> FakeInfo:
        return FakeInfo(self.exit_code, "train.py failed")

    def stop_job(self, job_id: str) -> bool:
        self.stopped.append(job_id)
        return True


JOB = RayJobSubmit(
    "http://127.0.0.1:8265",
    ("python3", "train.py", "--prompt-data", "/d/a b.jsonl"),
    {"env_vars": {"WANDB_API_KEY": "real-key"}, "working_dir": "/c"},
)


def test_a_job_is_submitted_with_real_secrets_and_its_logs_streamed(capsys, monkeypatch):
    monkeypatch.setattr("harness.live._POLL_S", 0)
    client = FakeJobClient([JobStatus.RUNNING, JobStatus.SUCCEEDED])
    run_job(JOB, client)
    assert client.submitted == {
        "entrypoint": "python3 train.py --prompt-data '/d/a b.jsonl'",
        "runtime_env": {"env_vars": {"WANDB_API_KEY": "real-key"}, "working_dir": "/c"},
    }
    assert capsys.readouterr().out == "step 1\nstep 2\n"


class AgentLate(FakeJobClient):
    """A job server whose head's agent is not up for the first `refusals` submissions."""

    def __init__(self, refusals: int, error: str, *args: Any) -> None:
        super().__init__(*args)
        self.refusals, self.error, self.attempts = refusals, error, 0

    def submit_job(self, *, entrypoint: str, runtime_env: dict) -> str:
        self.attempts += 1
        if self.attempts <= self.refusals:
            raise RuntimeError(self.error)
        return super().submit_job(entrypoint=entrypoint, runtime_env=runtime_env)


NO_AGENT = (
    "Request failed with status code 500: No available agent to submit job, please try again "
    "later.."
)


def test_a_submission_ray_refuses_for_want_of_its_job_agent_is_made_again(monkeypatch, capsys):
    """Ray says to try again later while its head's dashboard agent registers; the job is then
    submitted once it is up. Any other refusal, or one past the wait, ends the step."""
    monkeypatch.setattr("harness.live._POLL_S", 0)
    client = AgentLate(2, NO_AGENT, [JobStatus.SUCCEEDED])
    run_job(JOB, client)
    assert client.attempts == 3 and client.submitted
    assert capsys.readouterr().err.count("not up yet; submitting again") == 2
    other = AgentLate(1, "Request failed with status code 400: bad runtime_env", [])
    with pytest.raises(RuntimeError, match="400"):
        run_job(JOB, other)
    assert other.attempts == 1
    monkeypatch.setattr("harness.live._AGENT_WAIT_S", 0)
    late = AgentLate(5, NO_AGENT, [])
    with pytest.raises(RuntimeError, match="No available agent"):
        run_job(JOB, late)
    assert late.attempts == 1


def test_a_failed_job_reports_its_driver_exit_code():
    with pytest.raises(StepFailed, match=r"raysubmit_1 FAILED: train\.py failed") as failure:
        run_job(JOB, FakeJobClient([JobStatus.FAILED], exit_code=2))
    assert failure.value.exit_code == 2
    with pytest.raises(StepFailed) as stopped:
        run_job(JOB, FakeJobClient([JobStatus.STOPPED], exit_code=None))
    assert stopped.value.exit_code == 1


def test_a_driver_killed_by_a_signal_says_which_and_exits_as_a_shell_would():
    with pytest.raises(
        StepFailed, match=r"FAILED: train\.py failed \(train\.py was killed by SIGKILL\)"
    ):
        run_job(JOB, FakeJobClient([JobStatus.FAILED], exit_code=-9))  # the OOM killer, say
    with pytest.raises(StepFailed) as failure:
        run_job(JOB, FakeJobClient([JobStatus.FAILED], exit_code=-9))
    assert failure.value.exit_code == 137


def test_ctrl_c_stops_the_job():
    client = FakeJobClient([JobStatus.RUNNING], interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        run_job(JOB, client)
    assert client.stopped == ["raysubmit_1"]


def test_losing_the_job_server_stops_the_job():
    class Lost(FakeJobClient):
        def get_job_status(self, job_id: str) -> JobStatus:
            raise ConnectionError("job server gone")

    client = Lost([JobStatus.RUNNING])
    with pytest.raises(ConnectionError):
        run_job(JOB, client)
    assert client.stopped == ["raysubmit_1"]


RUN = f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py@cpu/live-unit"


@pytest.fixture
def job_server():
    """The address of an HTTP server of run `RUN` (standing in for its Ray's job server)."""
    port = free_port()
    with http_server(port, tag=RUN):
        yield f"http://127.0.0.1:{port}"


def test_a_run_of_its_own_ray_submits_with_the_run_token(tmp_path, monkeypatch, job_server):
    token_file = tmp_path / "auth_token"
    token_file.write_text("t0k3n-of-this-run")
    made: list[dict] = []

    class Client(FakeJobClient):
        def __init__(self, address: str, headers: dict) -> None:
            super().__init__([JobStatus.SUCCEEDED])
            made.append({"address": address, "headers": headers})

    monkeypatch.setattr("harness.job_client.TimedJobClient", Client)
    step = RayJobSubmit(job_server, JOB.entrypoint, JOB.runtime_env, str(token_file), tag=RUN)
    run_step(step, {})
    assert made == [
        {"address": job_server, "headers": {"Authorization": "Bearer t0k3n-of-this-run"}}
    ]
    assert "t0k3n" not in step.render()
    assert "RAY_AUTH_TOKEN_PATH=" in step.render()


def test_the_token_never_goes_to_a_job_server_the_run_did_not_start(tmp_path):
    """Another user's server on the job server's port (taken after the claim) is refused
    before anything is sent to it; so is one of this user's that is not the run's."""
    another_user_or_skip()
    token_file = tmp_path / "auth_token"
    token_file.write_text("t0k3n-of-this-run")
    for other_user in (True, False):
        port = free_port()
        address = f"http://127.0.0.1:{port}"
        step = RayJobSubmit(address, JOB.entrypoint, JOB.runtime_env, str(token_file), tag=RUN)
        with http_server(port, other_user=other_user) as impostor:
            with pytest.raises(StepFailed, match=f"127.0.0.1:{port}: not this run.s Ray"):
                run_step(step, {})
            assert impostor.stop() == []


def test_secret_values_are_scrubbed_from_the_console(capsys, monkeypatch):
    monkeypatch.setattr("harness.live._POLL_S", 0)

    class Chatty(FakeJobClient):
        async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
            yield "key is real-key\n"

    run_job(JOB, Chatty([JobStatus.SUCCEEDED]))
    assert capsys.readouterr().out == "key is <redacted>\n"
    plan = plan_of(Shell(("python3", "-c", "raise SystemExit(3)"), env={"X": "pw-s3cr3t"}))
    plan = Plan(
        plan.launcher,
        "train",
        plan.hardware,
        HostView({"DB_PASSWORD": "pw-s3cr3t", "PATH": os.environ["PATH"]}, "/h", "/c", "/c", "r"),
        plan.steps,
    )
    assert execute_plan(plan) == 3
    assert "pw-s3cr3t" not in capsys.readouterr().err


def test_a_jobs_secrets_are_in_a_private_file_while_it_runs_and_only_there(
    tmp_path, monkeypatch, job_server
):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "auth_token").write_text("t0k3n")
    seen: dict = {}

    class Client(FakeJobClient):
        def __init__(self, address: str, headers: dict) -> None:
            super().__init__([JobStatus.SUCCEEDED])

        def submit_job(self, *, entrypoint: str, runtime_env: dict) -> str:
            env_file = run_dir / "job_env"
            seen["mode"] = stat.S_IMODE(env_file.stat().st_mode)
            seen["secrets"] = json.loads(env_file.read_text())
            seen["runtime_env"] = runtime_env
            return super().submit_job(entrypoint=entrypoint, runtime_env=runtime_env)

    monkeypatch.setattr("harness.job_client.TimedJobClient", Client)
    monkeypatch.setattr("harness.live._POLL_S", 0)
    runtime_env = {"env_vars": {"GRPO_JOB_ENV_FILE": str(run_dir / "job_env")}}
    step = RayJobSubmit(
        job_server,
        JOB.entrypoint,
        runtime_env,
        str(run_dir / "auth_token"),
        {"HF_TOKEN": "hf_1"},
        RUN,
    )
    run_step(step, {})
    assert seen["mode"] == 0o600 and seen["secrets"] == {"HF_TOKEN": "hf_1"}
    assert "hf_1" not in json.dumps(seen["runtime_env"])
    assert not (run_dir / "job_env").exists(), "the secrets outlive the job"


def test_every_request_to_the_job_server_has_a_timeout(monkeypatch):
    """A job server that accepts and never answers (a frozen Ray) ends each call in time."""
    from harness.job_client import TimedJobClient

    monkeypatch.setattr("harness.job_client.REQUEST_TIMEOUT_S", 0.5)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        started = time.monotonic()
        with pytest.raises(OSError, match="timed out"):
            TimedJobClient(f"http://127.0.0.1:{silent.getsockname()[1]}")
        assert time.monotonic() - started < 5


def test_a_job_server_that_stops_answering_ends_the_wait_and_the_job(monkeypatch):
    monkeypatch.setattr("harness.live._ALIVE_S", 0.1)

    class Frozen(FakeJobClient):
        async def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
            yield "step 1\n"
            await asyncio.sleep(3600)  # no log line, no close: the server hangs
            yield "never\n"

        def get_job_status(self, job_id: str) -> JobStatus:
            raise TimeoutError("the job server did not answer in 15 s")

    client = Frozen([JobStatus.RUNNING])
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not answer"):
        run_job(JOB, client)
    assert time.monotonic() - started < 5
    assert client.stopped == ["raysubmit_1"]


def test_a_driver_killed_through_its_shell_names_the_signal_too():
    """Ray runs the entrypoint through a shell, which reports SIGKILL as 137."""
    with pytest.raises(StepFailed, match=r"\(train\.py was killed by SIGKILL\)") as failure:
        run_job(JOB, FakeJobClient([JobStatus.FAILED], exit_code=137))
    assert failure.value.exit_code == 137


def test_what_an_earlier_run_left_is_named_when_the_claim_stops_it(tmp_path, capsys):
    launcher = f"{tmp_path}/launchers/x.py"
    earlier = subprocess.Popen(
        ["bash", "-c", 'exec -a "python3 train.py" sleep 600'],
        env={**os.environ, TAG_VAR: f"{launcher}@cpu/earlier"},
    )
    time.sleep(0.3)  # exec -a has replaced bash
    tag = RunTag(launcher, "cpu", "now")
    try:
        run_step(ClaimRun(str(tag), str(tmp_path)), {})
    finally:
        earlier.kill()
        earlier.wait()
        ownership.release(tag)
    assert "stopped 1 processes left by an earlier run of launchers/x.py on cpu" in (
        capsys.readouterr().err
    )
