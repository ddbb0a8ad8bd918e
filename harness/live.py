"""Live mode: execute a validated plan's steps, each with its proper library.

Hub downloads use ``huggingface_hub.snapshot_download`` (progress bars, resume); Ray starts
through Ray's own CLI, and a run's processes are claimed and released by `harness.ownership`;
jobs go through ``ray.job_submission.JobSubmissionClient``, whose logs are streamed and whose
real exit status is returned. Subprocesses run with this interpreter's environment first on
PATH, so the ``python3`` of a job resolves to it.

Every failure is one line and a non-zero exit; SIGTERM is handled like Ctrl-C. Either way the
Ray job is stopped and, when this plan started Ray, so is that Ray (and nothing else).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness import ownership
from harness.context import Plan
from harness.errors import Terminated
from harness.run_tag import RunTag
from harness.secrets import scrub
from harness.steps import (
    ClaimRun,
    Command,
    HubDownload,
    RayJobSubmit,
    RayStart,
    RayStop,
    Shell,
    Step,
    WaitForCluster,
    WaitForHead,
    WriteFile,
)

_POLL_S = 2.0
StepRunner = Callable[[Step, Mapping[str, str]], None]


class StepFailed(Exception):
    """A live step failed; `exit_code` is what the launcher exits with."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code or 1


def live_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: os.environ) with this interpreter's bin directory first on PATH."""
    env = dict(os.environ if base is None else base)
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(
        [bindir, *(p for p in env.get("PATH", "").split(os.pathsep) if p)]
    )
    return env


def execute_plan(plan: Plan, run: StepRunner | None = None) -> int:
    """Run every step in order with `run` (default `run_step`); 0 on success, else non-zero.

    Any failure is reported in one line (no traceback) and ends the plan; a failure, Ctrl-C or
    SIGTERM then stops the Ray this plan started, if any and not stopped yet. Ctrl-C and
    SIGTERM are re-raised for the caller's exit status.
    """
    run = run or run_step
    env = live_env(plan.host.env)
    total = len(plan.steps)
    started: list[str] = []  # tags of the Rays this plan started and has not stopped
    with _SigtermAsInterrupt() as sigterm:
        for index, step in enumerate(plan.steps, 1):
            _progress(scrub(f"step {index}/{total}: {_one_line(step.render())}", env))
            if isinstance(step, RayStart) and step.tag is not None:
                started.append(step.tag)  # before it runs: a half-started Ray is ours too
            try:
                run(step, env)
            except KeyboardInterrupt:
                _stop_started(started, plan, run, env)
                if sigterm.received:
                    raise Terminated from None
                raise
            except Exception as failure:  # every failure: one line, cleanup, non-zero
                reason = _one_line(str(failure) or type(failure).__name__, 400)
                _progress(scrub(f"error: {reason}", env))
                _stop_started(started, plan, run, env)
                return failure.exit_code if isinstance(failure, StepFailed) else 1
            if isinstance(step, RayStop) and step.tag in started:
                started.remove(step.tag)
    return 0


class _SigtermAsInterrupt:
    """Within: SIGTERM raises KeyboardInterrupt and is remembered (main thread only).

    Remembered, because code it interrupts (asyncio's runner) may re-raise a plain
    KeyboardInterrupt in place of the one raised here.
    """

    def __init__(self) -> None:
        self.received = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: object) -> None:
        self.received = True
        raise Terminated

    def __enter__(self) -> _SigtermAsInterrupt:
        try:
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread: nothing changes
            self._previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _stop_started(started: list[str], plan: Plan, run: StepRunner, env: Mapping[str, str]) -> None:
    for tag in started:
        try:
            run(RayStop(tag, plan.host.checkout), env)
        except Exception as failure:
            _progress(f"error: stopping Ray of {tag}: {failure}")


def _one_line(command: str, width: int = 120) -> str:
    """A rendered step as one line (continuations joined), shortened to `width`."""
    text = " ".join(line.strip().removesuffix("\\").strip() for line in command.splitlines())
    return text if len(text) <= width else text[: width - 3] + "..."


def _progress(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


@functools.singledispatch
def run_step(step: Step, env: Mapping[str, str]) -> None:
    raise TypeError(f"no live runner for {type(step).__name__}")


@run_step.register
def _(step: HubDownload, env: Mapping[str, str]) -> None:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(
            repo_id=step.repo_id,
            repo_type=step.repo_type,
            local_dir=step.local_dir,
            allow_patterns=list(step.allow_patterns) or None,
        )
    except Exception as err:  # the Hub raises many types; each is one failed download
        raise StepFailed(f"downloading {step.repo_id}: {err}") from err


@run_step.register
def _(step: ClaimRun, env: Mapping[str, str]) -> None:
    try:
        stopped = ownership.claim(RunTag.parse(step.tag), step.ports, step.token_path)
    except ownership.Refused as refusal:
        raise StepFailed(f"refused: {refusal}") from None
    if stopped:
        _progress(f"stopped {stopped} processes of an earlier run of {step.tag.split('/')[0]}")


@run_step.register
def _(step: WriteFile, env: Mapping[str, str]) -> None:
    try:
        os.makedirs(os.path.dirname(step.path) or ".", exist_ok=True)
        with open(step.path, "w") as file:
            file.write(step.content)
        os.chmod(step.path, step.mode)
    except OSError as err:
        raise StepFailed(f"writing {step.path}: {err.strerror or err}") from None
    _progress(f"wrote {step.path}")


@run_step.register
def _(step: RayStop, env: Mapping[str, str]) -> None:
    ownership.release(RunTag.parse(step.tag))


@run_step.register(WaitForCluster)
@run_step.register(WaitForHead)
def _(step: Step, env: Mapping[str, str]) -> None:
    """Its own one-line error (the command's last stderr line) is the step's failure."""
    for command in step.commands():
        try:
            done = subprocess.run(
                command.argv,
                cwd=command.cwd,
                env={**env, **command.env},
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        except OSError as err:
            raise StepFailed(f"{command.argv[0]}: {err.strerror or err}") from err
        if done.returncode:
            lines = done.stderr.strip().splitlines() or [f"exited with {done.returncode}"]
            raise StepFailed(lines[-1], done.returncode)


@run_step.register(RayStart)
@run_step.register(Shell)
def _(step: Step, env: Mapping[str, str]) -> None:
    for command in step.commands():
        _run(command, env)


def _run(command: Command, env: Mapping[str, str]) -> None:
    try:
        done = subprocess.run(
            command.argv, cwd=command.cwd, env={**env, **command.env}, check=False
        )
    except OSError as err:
        raise StepFailed(f"{command.argv[0]}: {err.strerror or err}") from err
    if done.returncode and not command.ignore_failure:
        raise StepFailed(f"{command.argv[0]} exited with {done.returncode}", done.returncode)


@run_step.register
def _(step: RayJobSubmit, env: Mapping[str, str]) -> None:
    from ray.job_submission import JobSubmissionClient

    headers = {}
    if step.auth_token_path is not None:  # a cluster this run started: its own token
        headers["Authorization"] = f"Bearer {_read_token(step.auth_token_path)}"
    else:
        _follow_ray_token_auth()
    try:
        client = JobSubmissionClient(step.address, headers=headers)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise StepFailed(f"cannot reach the Ray job server at {step.address}: {err}") from None
    run_job(step, client, secrets_of={**env, **step.env_vars})


def _read_token(path: str) -> str:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError as err:
        raise StepFailed(f"Ray authentication token {path}: {err.strerror or err}") from None


def _follow_ray_token_auth() -> None:
    """Authenticate like `ray start` does: with RAY_AUTH_MODE unset, a token in ~/.ray turns
    token auth on for the cluster, so the submitting client must send it too."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def run_job(step: RayJobSubmit, client: Any, secrets_of: Mapping[str, str] | None = None) -> None:
    """Submit `step` with `client`, stream its logs, and raise `StepFailed` unless it succeeds.

    The values of secrets in `secrets_of` (default: the job's env vars) are scrubbed from the
    streamed logs. Ctrl-C, SIGTERM or any error while following the job stops it before
    re-raising.
    """
    from ray.job_submission import JobStatus

    job_id = client.submit_job(
        entrypoint=shlex.join(step.entrypoint), runtime_env=dict(step.runtime_env)
    )
    _progress(f"Ray job {job_id} submitted to {step.address}")
    try:
        hidden = step.env_vars if secrets_of is None else secrets_of
        asyncio.run(_stream_logs(client, job_id, hidden))
        status = client.get_job_status(job_id)
        while not status.is_terminal():
            time.sleep(_POLL_S)
            status = client.get_job_status(job_id)
    except BaseException:  # Ctrl-C, SIGTERM, a lost connection: the job must not run on
        with contextlib.suppress(Exception):
            client.stop_job(job_id)
            _progress(f"Ray job {job_id} stopped")
        raise
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        code = getattr(info, "driver_exit_code", None) or 1
        message = (getattr(info, "message", None) or "").strip()
        reason = f": {message.splitlines()[0]}" if message else ""  # the logs were streamed
        raise StepFailed(f"Ray job {job_id} {status.value}{reason}", code)


async def _stream_logs(client: Any, job_id: str, hidden: Mapping[str, str]) -> None:
    async for lines in client.tail_job_logs(job_id):
        sys.stdout.write(scrub(lines, hidden))
        sys.stdout.flush()
