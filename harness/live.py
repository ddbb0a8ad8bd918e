"""Live mode: execute a validated plan's steps, each with its proper library.

Hub downloads use ``huggingface_hub.snapshot_download`` (progress bars, resume); Ray starts and
stops through Ray's own CLI; jobs go through ``ray.job_submission.JobSubmissionClient``, whose
logs are streamed and whose real exit status is returned. Subprocesses run with this
interpreter's environment first on PATH, so the ``python3`` of a job resolves to it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.context import Plan
from harness.steps import (
    Command,
    HubDownload,
    ProcessCleanup,
    RayJobSubmit,
    RayStart,
    RayStop,
    Shell,
    Step,
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
    """Run every step in order with `run` (default `run_step`); 0 on success, else the failing
    step's exit code.

    When a step fails or is interrupted, the plan's remaining `RayStop` steps still run, so a
    launcher that started its own Ray does not leave it behind.
    """
    run = run or run_step
    env = live_env(plan.host.env)
    total = len(plan.steps)
    for index, step in enumerate(plan.steps, 1):
        _progress(f"step {index}/{total}: {_one_line(step.render())}")
        try:
            run(step, env)
        except StepFailed as failure:
            _progress(f"error: {failure}")
            _stop_ray(plan.steps[index:], run, env)
            return failure.exit_code
        except KeyboardInterrupt:
            _stop_ray(plan.steps[index:], run, env)
            raise
    return 0


def _stop_ray(steps: tuple[Step, ...], run: StepRunner, env: Mapping[str, str]) -> None:
    for step in steps:
        if isinstance(step, RayStop):
            try:
                run(step, env)
            except StepFailed as failure:
                _progress(f"error: {failure}")


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
def _(step: ProcessCleanup, env: Mapping[str, str]) -> None:
    for command in step.commands():
        if shutil.which(command.argv[0], path=env.get("PATH")):
            _run(command, env)


@run_step.register(RayStart)
@run_step.register(RayStop)
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

    _follow_ray_token_auth()
    run_job(step, JobSubmissionClient(step.address))


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


def run_job(step: RayJobSubmit, client: Any) -> None:
    """Submit `step` with `client`, stream its logs, and raise `StepFailed` unless it succeeds.

    Ctrl-C stops the job before re-raising.
    """
    from ray.job_submission import JobStatus

    job_id = client.submit_job(
        entrypoint=shlex.join(step.entrypoint), runtime_env=dict(step.runtime_env)
    )
    _progress(f"Ray job {job_id} submitted to {step.address}")
    try:
        asyncio.run(_stream_logs(client, job_id))
        status = client.get_job_status(job_id)
        while not status.is_terminal():
            time.sleep(_POLL_S)
            status = client.get_job_status(job_id)
    except KeyboardInterrupt:
        client.stop_job(job_id)
        _progress(f"Ray job {job_id} stopped")
        raise
    if status != JobStatus.SUCCEEDED:
        info = client.get_job_info(job_id)
        code = getattr(info, "driver_exit_code", None) or 1
        message = (getattr(info, "message", None) or "").strip()
        reason = f": {message.splitlines()[0]}" if message else ""  # the logs were streamed
        raise StepFailed(f"Ray job {job_id} {status.value}{reason}", code)


async def _stream_logs(client: Any, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        sys.stdout.write(lines)
        sys.stdout.flush()
