"""Live mode: execute a validated plan's steps, each with its proper library.

Hub downloads use ``huggingface_hub.snapshot_download`` (progress bars, resume), a bundle is
checked against its manifest (`harness.bundle_manifest`); Ray starts through Ray's own CLI,
and a run's processes are claimed and released by `harness.ownership`; jobs go through
``ray.job_submission.JobSubmissionClient``, whose logs are streamed and whose real exit status
is returned. Subprocesses run with this interpreter's environment first on PATH, so the
``python3`` of a job resolves to it.

Every failure is one line and a non-zero exit; SIGTERM and SIGHUP are handled like Ctrl-C.
Either way the Ray job is stopped and, when this plan started Ray, so is that Ray (and nothing
else). Ray's daemons run in a session of their own, so a terminal's Ctrl-C reaches the launcher
alone, and every request to Ray's job server has a timeout: the launcher ends within seconds.
A job whose Ray was killed from outside says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil

from common.owned_files import NotPrivate, owned_dir, write_atomic
from common.secrets import is_secret, scrub
from harness import ownership
from harness.bundle_manifest import BundleError, file_count, verify
from harness.context import Plan, check_local_inputs, local_output_dirs
from harness.errors import LaunchError, Terminated
from harness.lease import Lease
from harness.locks import Locked, exclusive_lock
from harness.private_files import write_secret
from harness.run_tag import OUTPUT_LOCK, RunTag
from harness.steps import (
    ClaimRun,
    Command,
    HubDownload,
    RayJobSubmit,
    RayStart,
    RayStop,
    Shell,
    Step,
    VerifyBundle,
    VerifyRay,
    WaitForCluster,
    WaitForHead,
    WriteFile,
)

_POLL_S = 2.0
_ALIVE_S = 30.0
_VERIFY_S = 30.0  # for Ray to bind a port it was given
# Ray's job server answers this (HTTP 500) while its head's dashboard agent has not registered:
# it waits 10 s for one, and a fresh head on a busy node can take longer. No job exists then,
# so the submission is made again, for up to `_AGENT_WAIT_S`.
_NO_AGENT = "No available agent to submit job"
_AGENT_WAIT_S = 120.0
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

    Held to the end: the slot lock of each run the plan claims and a lock on each output dir
    a train.py of this node writes (a second launch of the same run is refused by name). Just
    before the claim, train.py's input checks run here (`check_local_inputs`); once the claim
    has made the run's private dir, its `Lease` ends what the run started should the launcher
    be killed. Any failure is reported in one line (no traceback) and ends the plan; a
    failure, Ctrl-C or SIGTERM then stops the Ray this plan started, if any and not stopped
    yet. Ctrl-C and SIGTERM are re-raised for the caller's exit status.
    """
    run = run or run_step
    env = live_env(plan.host.env)
    hidden = {**env, **plan.secret_env}
    total = len(plan.steps)
    started: list[str] = []  # tags of the Rays this plan started and has not stopped
    with _SignalsAsInterrupt() as signals, contextlib.ExitStack() as held:
        try:
            _hold_locks(plan, held)
        except ownership.Refused as refusal:
            _progress(scrub(f"error: refused: {refusal}", hidden))
            return 1
        leases: list[Lease] = []
        held.callback(lambda: [lease.close() for lease in leases])
        for index, step in enumerate(plan.steps, 1):
            _progress(scrub(f"step {index}/{total}: {_one_line(step.render())}", hidden))
            if isinstance(step, RayStart) and step.tag is not None:
                started.append(step.tag)  # before it runs: a half-started Ray is ours too
            try:
                if isinstance(step, ClaimRun):
                    _check_inputs(plan)
                run(step, env)
                if isinstance(step, ClaimRun):
                    leases.append(Lease(step.tag, step.checkout, daemon_env(env)))
            except KeyboardInterrupt:
                _stop_started(started, plan, run, env)
                if signals.received is not None:
                    raise Terminated(signals.received) from None
                raise
            except Exception as failure:  # every failure: one line, cleanup, non-zero
                reason = _one_line(str(failure) or type(failure).__name__, 400)
                if isinstance(step, RayJobSubmit) and (killed := _killed_rays(started)):
                    reason = f"{killed} ({reason})"
                _progress(scrub(f"error: {reason}", hidden))
                _stop_started(started, plan, run, env)
                return failure.exit_code if isinstance(failure, StepFailed) else 1
            if isinstance(step, RayStop) and step.tag in started:
                started.remove(step.tag)
        for lease in leases:
            lease.end()
    return 0


def _hold_locks(plan: Plan, held: contextlib.ExitStack) -> None:
    """Take, into `held`, the slot lock of every run `plan` claims and a lock on every output
    dir a train.py of this node writes; `ownership.Refused` names a holder."""
    for step in plan.steps:
        if isinstance(step, ClaimRun):
            held.enter_context(ownership.slot_lock(RunTag.parse(step.tag)))
    for flag, path in local_output_dirs(plan):
        if flag != "--output-dir":
            continue
        try:
            os.makedirs(path, exist_ok=True)
            held.enter_context(exclusive_lock(f"{path}/{OUTPUT_LOCK}", plan.launcher.module))
        except Locked as holder:
            raise ownership.Refused(
                f"{path} is being written by {holder}; wait for it to end, or choose another "
                "--run-id or --output-dir"
            ) from None
        except (NotPrivate, OSError) as err:
            raise ownership.Refused(f"--output-dir {path}: {err}") from None


def _check_inputs(plan: Plan) -> None:
    try:
        check_local_inputs(plan)
    except LaunchError as err:
        raise StepFailed(str(err), 2) from None


def daemon_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` for the processes a run starts that live beside its job (Ray's daemons, the
    lease's watcher): without secrets, which any process of this user could read in their
    ``/proc/PID/environ`` (the job gets its own through `trainer.job_env`), and so without a
    ``RAY_AUTH_TOKEN`` of the user's shell, which Ray would prefer to the run's token file."""
    return {name: value for name, value in env.items() if not is_secret(name)}


def exit_status(returncode: int) -> tuple[int, str]:
    """A process's exit status as a shell gives it (128+N for signal N) and in words."""
    if returncode < 0 or (returncode > 128 and returncode - 128 in signal.valid_signals()):
        number = -returncode if returncode < 0 else returncode - 128
        name = signal.Signals(number).name if number in signal.valid_signals() else number
        return 128 + number, f"was killed by {name}"
    return returncode, f"exited with {returncode}"


class _SignalsAsInterrupt:
    """Within: SIGTERM and SIGHUP raise `Terminated` (a KeyboardInterrupt) and are remembered
    (main thread only). SIGHUP too: Ray's daemons, in a session of their own, outlive the
    terminal, so a launcher that dies with it must stop them first.

    Remembered, because code it interrupts (asyncio's runner) may re-raise a plain
    KeyboardInterrupt in place of the one raised here.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum
        raise Terminated(signum)

    def __enter__(self) -> _SignalsAsInterrupt:
        try:
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:  # not the main thread: nothing changes
            self._previous = {}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


_DAEMONS_SETTLE_S = 2.0  # a node-wide stop or the OOM killer takes the daemons one by one


def _killed_rays(started: list[str], settle_s: float = _DAEMONS_SETTLE_S) -> str | None:
    """Why a job lost its Ray, when a Ray head this plan started has lost its GCS, raylet or
    job server (the dashboard). The job notices the first loss: the others get `settle_s` to
    go too, so that the line names all that went."""
    for tag in started:
        run = RunTag.parse(tag)
        missing = _missing_daemons(run)
        deadline = time.monotonic() + settle_s
        while missing and len(missing) < len(_ESSENTIAL) and time.monotonic() < deadline:
            time.sleep(0.2)
            missing = _missing_daemons(run)
        if missing:
            return (
                f"this run's Ray was stopped from outside the launcher while the job ran (its "
                f"{', '.join(missing)} ended: killed by a signal, a node-wide `ray stop`, the "
                "OOM killer or the node's shutdown)"
            )
    return None


_ESSENTIAL: dict[str, Callable[[ownership.Seen], bool]] = {
    "gcs_server": lambda s: s.name == "gcs_server",
    "raylet": lambda s: s.name == "raylet",
    "dashboard": lambda s: "dashboard/dashboard.py" in s.cmdline,
}


def _missing_daemons(tag: RunTag) -> list[str]:
    """The essential daemons of run `tag`'s Ray head that no longer run (a zombie has ended)."""
    running = [s for s in ownership.of_run(tag, ownership.processes()) if _running(s)]
    return [name for name, is_it in _ESSENTIAL.items() if not any(map(is_it, running))]


def _running(seen: ownership.Seen) -> bool:
    try:
        return seen.process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stop_started(started: list[str], plan: Plan, run: StepRunner, env: Mapping[str, str]) -> None:
    with _uninterrupted():
        for tag in started:
            try:
                run(RayStop(tag, plan.host.checkout), env)
            except Exception as failure:
                _progress(f"error: stopping Ray of {tag}: {failure}")


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Within, Ctrl-C, SIGTERM and SIGHUP are ignored (main thread only): a second Ctrl-C
    must not leave half a Ray running. What runs within ends by itself (release's grace)."""
    previous: dict[int, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: nothing changes
        for signum in (signal.SIGINT, *_SignalsAsInterrupt.SIGNALS):
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _one_line(command: str, width: int = 120) -> str:
    """A rendered step as one line (continuations joined), shortened to `width`."""
    text = " ".join(line.strip().removesuffix("\\").strip() for line in command.splitlines())
    return text if len(text) <= width else text[: width - 3] + "..."


def _progress(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


@functools.singledispatch
def run_step(step: Step, env: Mapping[str, str]) -> None:
    raise TypeError(f"no live runner for {type(step).__name__}")


def hub_download(step: HubDownload, revision: str | None = None) -> None:
    """`step`'s repository, at `revision` (default: its newest commit), into its folder; what an
    earlier try left is resumed."""
    from huggingface_hub import snapshot_download

    snapshot_download(
        repo_id=step.repo_id,
        repo_type=step.repo_type,
        revision=revision,
        local_dir=step.local_dir,
        allow_patterns=list(step.allow_patterns) or None,
    )


@run_step.register
def _(step: HubDownload, env: Mapping[str, str]) -> None:
    try:
        hub_download(step)
    except Exception as err:  # the Hub raises many types; each is one failed download
        raise StepFailed(f"downloading {step.repo_id}: {err}") from err


@run_step.register
def _(step: VerifyBundle, env: Mapping[str, str]) -> None:
    try:
        manifest = verify(step.path, hashes=False)  # hashed as the plan was built
    except BundleError as err:
        raise StepFailed(str(err), 2) from None
    count = file_count(manifest)
    _progress(f"bundle {step.path}: {count} files as its manifest says")


@run_step.register
def _(step: ClaimRun, env: Mapping[str, str]) -> None:
    try:
        stopped = ownership.claim(RunTag.parse(step.tag), step.ports, step.token_path)
    except ownership.Refused as refusal:
        raise StepFailed(f"refused: {refusal}") from None
    if stopped:
        tag = RunTag.parse(step.tag)
        launcher = os.path.relpath(tag.launcher, step.checkout)
        _progress(
            f"stopped {stopped} processes left by an earlier run of {launcher} on {tag.devices}"
        )


@run_step.register
def _(step: WriteFile, env: Mapping[str, str]) -> None:
    try:
        owned_dir(os.path.dirname(os.path.abspath(step.path)))
        write_atomic(step.path, step.content, step.mode)
    except NotPrivate as err:
        raise StepFailed(f"writing {step.path}: {err}") from None
    except OSError as err:
        raise StepFailed(f"writing {step.path}: {err.strerror or err}") from None
    _progress(f"wrote {step.path}")


@run_step.register
def _(step: RayStop, env: Mapping[str, str]) -> None:
    ownership.release(RunTag.parse(step.tag))


@run_step.register
def _(step: VerifyRay, env: Mapping[str, str]) -> None:
    try:
        ownership.verify(RunTag.parse(step.tag), step.ports, step.timeout_s)
    except ownership.Refused as refusal:
        raise StepFailed(f"refused: {refusal}") from None


@run_step.register(WaitForCluster)
@run_step.register(WaitForHead)
def _(step: Step, env: Mapping[str, str]) -> None:
    """Its own one-line error (the command's last stderr line) is the step's failure."""
    for command in step.commands():
        try:
            done = subprocess.run(
                command.argv,
                cwd=command.cwd,
                env={**daemon_env(env), **command.env},
                stderr=subprocess.PIPE,
                text=True,
                check=False,
            )
        except OSError as err:
            raise StepFailed(f"{command.argv[0]}: {err.strerror or err}") from err
        if done.returncode:
            status, said = exit_status(done.returncode)
            lines = done.stderr.strip().splitlines() or [f"{command.argv[0]} {said}"]
            raise StepFailed(lines[-1], status)


@run_step.register
def _(step: Shell, env: Mapping[str, str]) -> None:
    for command in step.commands():
        _run(command, env)


@run_step.register
def _(step: RayStart, env: Mapping[str, str]) -> None:
    """In a session of its own, with no secret in its environment (`daemon_env`): the daemons
    it leaves are out of the terminal's reach (its Ctrl-C goes to the foreground process
    group), and the launcher stops them. A worker's ``ray start --block`` runs until it is
    stopped; meanwhile its agent port is verified as a head's ports are (`VerifyRay`)."""
    (command,) = step.commands()
    process = _start(command, daemon_env(env), new_session=True)
    if step.block and step.tag is not None and step.agent_port is not None:
        try:
            ownership.verify(RunTag.parse(step.tag), (step.agent_port,), _VERIFY_S)
        except ownership.Refused as refusal:
            process.terminate()
            raise StepFailed(f"refused: {refusal}") from None
    _finish(command, process.wait())


def _run(command: Command, env: Mapping[str, str]) -> None:
    _finish(command, _start(command, env).wait())


def _start(
    command: Command, env: Mapping[str, str], *, new_session: bool = False
) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            command.argv, cwd=command.cwd, env={**env, **command.env}, start_new_session=new_session
        )
    except OSError as err:
        raise StepFailed(f"{command.argv[0]}: {err.strerror or err}") from err


def _finish(command: Command, returncode: int) -> None:
    if returncode and not command.ignore_failure:
        status, said = exit_status(returncode)
        raise StepFailed(f"{command.argv[0]} {said}", status)


@run_step.register
def _(step: RayJobSubmit, env: Mapping[str, str]) -> None:
    from harness.job_client import TimedJobClient

    headers = {}
    if step.auth_token_path is not None and step.tag is not None:  # this run's own Ray
        port = urllib.parse.urlsplit(step.address).port
        try:  # the token goes to this run's Ray alone
            ownership.verify(RunTag.parse(step.tag), (port or 80,), _VERIFY_S)
        except ownership.Refused as refusal:
            raise StepFailed(f"refused: {refusal}") from None
        headers["Authorization"] = f"Bearer {_read_token(step.auth_token_path)}"
    else:
        _follow_ray_token_auth()
    try:
        client = TimedJobClient(step.address, headers=headers)
    except (OSError, RuntimeError, ValueError) as err:
        raise StepFailed(f"cannot reach the Ray job server at {step.address}: {err}") from None
    if step.env_file is not None:
        try:
            write_secret(step.env_file, json.dumps(dict(step.secret_env)))
        except OSError as err:
            raise StepFailed(f"writing {step.env_file}: {err.strerror or err}") from None
    try:
        run_job(step, client, secrets_of={**env, **step.secrets})
    finally:
        if step.env_file is not None:  # the job has ended: its secrets are not kept
            with contextlib.suppress(FileNotFoundError):
                os.unlink(step.env_file)


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

    job_id = _submit(step, client)
    _progress(f"Ray job {job_id} submitted to {step.address}")
    try:
        hidden = step.secrets if secrets_of is None else secrets_of
        asyncio.run(_follow_logs(client, job_id, hidden))
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
        code, said = exit_status(code)
        if said.startswith("was killed"):  # the driver died of a signal: say which
            reason += f" (train.py {said})"
        raise StepFailed(f"Ray job {job_id} {status.value}{reason}", code)


def _submit(step: RayJobSubmit, client: Any) -> str:
    """`step`'s job submitted, again while Ray says its job agent is not up (`_NO_AGENT`)."""
    deadline = time.monotonic() + _AGENT_WAIT_S
    while True:
        try:
            return client.submit_job(
                entrypoint=shlex.join(step.entrypoint), runtime_env=dict(step.runtime_env)
            )
        except RuntimeError as err:
            if _NO_AGENT not in str(err) or time.monotonic() >= deadline:
                raise
        _progress(f"Ray's job agent at {step.address} is not up yet; submitting again")
        time.sleep(_POLL_S)


async def _follow_logs(client: Any, job_id: str, hidden: Mapping[str, str]) -> None:
    """Stream the job's logs until they end. While they are quiet, the job server must answer
    a status request every `_ALIVE_S` (each within the client's timeout): a server that stops
    answering ends the wait with an error instead of never."""
    stream = asyncio.ensure_future(_stream_logs(client, job_id, hidden))
    try:
        while not stream.done():
            await asyncio.wait({stream}, timeout=_ALIVE_S)
            if not stream.done():
                await asyncio.to_thread(client.get_job_status, job_id)
        stream.result()
    finally:
        stream.cancel()


async def _stream_logs(client: Any, job_id: str, hidden: Mapping[str, str]) -> None:
    async for lines in client.tail_job_logs(job_id):
        sys.stdout.write(scrub(lines, hidden))
        sys.stdout.flush()
