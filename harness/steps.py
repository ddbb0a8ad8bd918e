"""The typed steps a launcher emits, and their canonical shell text.

A step is pure data. `Step.render()` gives the shell a person would type (one flag per line,
quoted with shlex, secrets redacted); `harness.live` executes the same step with the proper
library. Nothing here runs anything.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NamedTuple

from common.secrets import redact_env
from harness.run_tag import JOB_ENV_FILE, TAG_VAR, RunTag

_FLAG = re.compile(r"^--[A-Za-z]|^--$")  # long flags start a line; -m, -9 stay put
_ONE_LINE_WIDTH = 72


class Command(NamedTuple):
    """One shell command of a step: what `render` prints and what live runs for subprocess steps."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = {}
    cwd: str | None = None
    ignore_failure: bool = False


def format_command(command: Command) -> str:
    """Shell text with the environment and each flag (with its values) on a line of its own.

    A short command without environment or directory stays on one line.
    """
    suffix = " || true" if command.ignore_failure else ""
    one_line = shlex.join(command.argv)
    if not command.env and not command.cwd and len(one_line) <= _ONE_LINE_WIDTH:
        return one_line + suffix
    lines = [f"cd {shlex.quote(command.cwd)} &&"] if command.cwd else []
    lines += [f"{name}={shlex.quote(value)}" for name, value in sorted(command.env.items())]
    head, *flags = _group_flags(command.argv)
    lines.append(shlex.join(head))
    lines += [f"  {shlex.join(group)}" for group in flags]
    return " \\\n".join(lines) + suffix


def _group_flags(argv: Sequence[str]) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    for token in argv:
        if _FLAG.match(token) and groups[-1]:
            groups.append([])
        groups[-1].append(token)
    return groups


def token_auth_env(token_path: str) -> dict[str, str]:
    """Ray's token authentication, on, with the token read from `token_path` (not a value)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}


def job_env_path(token_path: str) -> str:
    """The file of a job's secret variables: beside the run's token, in a private dir."""
    return f"{token_path.rsplit('/', 1)[0]}/{JOB_ENV_FILE}"


def runtime_env_json(runtime_env: Mapping[str, Any]) -> str:
    """Compact JSON with sorted keys: the canonical form of a Ray runtime env."""
    return json.dumps(runtime_env, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Step:
    """Base of every step; subclasses set `kind` and implement `commands`."""

    kind: ClassVar[str]

    def commands(self) -> tuple[Command, ...]:
        raise NotImplementedError

    def redacted(self) -> Step:
        """This step with secret values replaced; what recordings show."""
        return self

    def render(self) -> str:
        return "\n".join(format_command(c) for c in self.redacted().commands())

    def to_dict(self) -> dict[str, Any]:
        """Structured, redacted form (for diffs and JSON output)."""
        return {"kind": self.kind, **dataclasses.asdict(self.redacted())}


def _freeze(step: Step, **values: Any) -> None:
    for name, value in values.items():
        object.__setattr__(step, name, value)


@dataclass(frozen=True)
class HubDownload(Step):
    """Download a model or data set repository from the Hugging Face Hub into `local_dir`."""

    kind: ClassVar[str] = "hub_download"
    repo_id: str
    local_dir: str
    repo_type: Literal["model", "dataset"] = "model"
    allow_patterns: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.repo_type not in ("model", "dataset"):
            raise ValueError(f"repo_type must be model or dataset, not {self.repo_type!r}")
        _freeze(self, allow_patterns=tuple(self.allow_patterns))

    def commands(self) -> tuple[Command, ...]:
        argv = ["hf", "download", self.repo_id, "--repo-type", self.repo_type]
        argv += ["--local-dir", self.local_dir]
        for pattern in self.allow_patterns:
            argv += ["--include", pattern]
        return (Command(tuple(argv)),)


@dataclass(frozen=True)
class ClaimRun(Step):
    """Prepare this node for run `tag` (`harness.ownership.claim`).

    Stops what an earlier run of the same launcher on the same devices left behind, and
    refuses when a Ray or trainer this launcher did not start holds the devices or `ports`.
    Nothing else on the node is touched.
    """

    kind: ClassVar[str] = "claim_run"
    tag: str
    checkout: str
    ports: tuple[int, ...] = ()
    token_path: str | None = None  # where the run's fresh token goes; None: no token

    def __post_init__(self) -> None:
        RunTag.parse(self.tag)
        _freeze(self, ports=tuple(self.ports))

    def commands(self) -> tuple[Command, ...]:
        argv = ["python3", "-m", "harness.ownership", "claim", "--tag", self.tag]
        for port in self.ports:
            argv += ["--port", str(port)]
        if self.token_path is not None:
            argv += ["--token-path", self.token_path]
        return (Command(tuple(argv), cwd=self.checkout),)


@dataclass(frozen=True)
class RayStart(Step):
    """``ray start``: a head node (`head=True`) or a worker joining `head_address`.

    With a run `tag` the Ray processes carry it in their environment and keep their files in
    the run's own temp dir (inside its private dir), so that only they are stopped afterwards,
    and the cluster requires Ray's token authentication with the run's token file (`ClaimRun`
    writes it). Live, Ray's daemons start in a session of their own: a terminal's Ctrl-C
    reaches the launcher, which stops the job and then this Ray, not Ray itself.
    """

    kind: ClassVar[str] = "ray_start"
    node_ip_address: str | None  # None: Ray picks the node's routable address (several nodes)
    num_gpus: int
    head: bool = True
    head_address: str | None = None
    port: int = 6379
    num_cpus: int | None = None
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8265
    env: Mapping[str, str] = field(default_factory=dict)
    tag: str | None = None
    token_path: str | None = None  # token authentication with this token file
    block: bool = False
    agent_port: int | None = None
    client_server_port: int | None = None  # Ray Client's server (a head only; Ray's default 10001)

    def __post_init__(self) -> None:
        if self.head == (self.head_address is not None):
            raise ValueError("a head node takes no head_address; a worker needs one")
        if self.tag is not None:
            RunTag.parse(self.tag)
        _freeze(self, env=dict(self.env))

    def commands(self) -> tuple[Command, ...]:
        argv = ["ray", "start"]
        if self.head:
            argv += ["--head"]
        else:
            argv += ["--address", str(self.head_address)]
        if self.node_ip_address is not None:
            argv += ["--node-ip-address", self.node_ip_address]
        if self.head:
            argv += ["--port", str(self.port)]
        argv += ["--num-gpus", str(self.num_gpus)]
        if self.num_cpus is not None:
            argv += ["--num-cpus", str(self.num_cpus)]
        if self.head:
            argv += ["--dashboard-host", self.dashboard_host]
            argv += ["--dashboard-port", str(self.dashboard_port)]
            if self.client_server_port is not None:
                argv += ["--ray-client-server-port", str(self.client_server_port)]
        env = dict(self.env)
        if self.tag is not None:
            argv += ["--temp-dir", RunTag.parse(self.tag).temp_dir]
            env[TAG_VAR] = self.tag
        if self.token_path is not None:
            env.update(token_auth_env(self.token_path))
        if self.agent_port is not None:
            argv += ["--dashboard-agent-listen-port", str(self.agent_port)]
        if self.block:
            argv.append("--block")
        argv.append("--disable-usage-stats")
        return (Command(tuple(argv), env),)

    def redacted(self) -> RayStart:
        return dataclasses.replace(self, env=redact_env(self.env))


@dataclass(frozen=True)
class VerifyRay(Step):
    """Check that run `tag`'s own Ray processes, and nothing else, listen on `ports`
    (`harness.ownership.verify`), before anything sends them the run's token.

    Between the claim and ``ray start`` another user may bind one of the ports; Ray's
    dashboard (the job server) then fails to start while ``ray start`` still exits 0, and a
    job submission would hand the token to that user's server. Waits up to `timeout_s` for
    Ray to bind every port; else one line, exit 1.
    """

    kind: ClassVar[str] = "verify_ray"
    tag: str
    checkout: str
    ports: tuple[int, ...]
    timeout_s: int = 30

    def __post_init__(self) -> None:
        RunTag.parse(self.tag)
        _freeze(self, ports=tuple(self.ports))

    def commands(self) -> tuple[Command, ...]:
        argv = ["python3", "-m", "harness.ownership", "verify", "--tag", self.tag]
        for port in self.ports:
            argv += ["--port", str(port)]
        argv += ["--timeout", str(self.timeout_s)]
        return (Command(tuple(argv), cwd=self.checkout),)


@dataclass(frozen=True)
class WaitForCluster(Step):
    """Wait, up to `timeout_s`, until the Ray cluster at `address` (``HOST:PORT`` of its GCS)
    has `nodes` alive nodes and `gpus` GPUs (`harness.cluster`); else one line, exit 1."""

    kind: ClassVar[str] = "wait_for_cluster"
    address: str
    nodes: int
    gpus: int
    timeout_s: int
    token_path: str
    checkout: str

    def commands(self) -> tuple[Command, ...]:
        argv = ("python3", "-m", "harness.cluster", "wait", "--address", self.address)
        argv += ("--nodes", str(self.nodes), "--gpus", str(self.gpus))
        argv += ("--timeout", str(self.timeout_s))
        return (Command(argv, token_auth_env(self.token_path), self.checkout),)


@dataclass(frozen=True)
class WaitForHead(Step):
    """Wait, up to `timeout_s`, until the head's GCS at `address` answers and its token file
    exists (a worker joins only then); else one line, exit 1."""

    kind: ClassVar[str] = "wait_for_head"
    address: str
    timeout_s: int
    token_path: str
    checkout: str

    def commands(self) -> tuple[Command, ...]:
        argv = ("python3", "-m", "harness.cluster", "wait-head", "--address", self.address)
        argv += ("--token-file", self.token_path, "--timeout", str(self.timeout_s))
        return (Command(argv, cwd=self.checkout),)


@dataclass(frozen=True)
class RayStop(Step):
    """Stop the Ray that run `tag` started, and nothing else (`harness.ownership.release`).

    ``ray stop`` would end every Ray process of the node, other users' included.
    """

    kind: ClassVar[str] = "ray_stop"
    tag: str
    checkout: str

    def __post_init__(self) -> None:
        RunTag.parse(self.tag)

    def commands(self) -> tuple[Command, ...]:
        argv = ("python3", "-m", "harness.ownership", "release", "--tag", self.tag)
        return (Command(argv, cwd=self.checkout),)


@dataclass(frozen=True)
class RayJobSubmit(Step):
    """``ray job submit``: run `entrypoint` as a Ray job with `runtime_env`, wait, stream logs.

    Secrets never travel in the entrypoint. With `auth_token_path` and `tag` (a cluster run
    `tag` started) the submission authenticates with the token in that file, once the run's own
    Ray, and nothing else, is seen listening on the job server's port; the job's secret variables,
    `secret_env`, go into `env_file` beside it (mode 0600, in the run's private dir, removed
    when the job ends), which `runtime_env` names (`trainer.job_env`): Ray logs a runtime env's
    variables in clear text. Otherwise secrets are variables of `runtime_env`.
    """

    kind: ClassVar[str] = "ray_job_submit"
    address: str
    entrypoint: tuple[str, ...]
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    auth_token_path: str | None = None
    secret_env: Mapping[str, str] = field(default_factory=dict)
    tag: str | None = None

    def __post_init__(self) -> None:
        if not self.entrypoint:
            raise ValueError("a Ray job needs an entrypoint")
        if (self.tag is None) != (self.auth_token_path is None):
            raise ValueError("a token goes only to the Ray of run `tag`: give both or neither")
        if self.tag is not None:
            RunTag.parse(self.tag)
        if self.secret_env and self.auth_token_path is None:
            raise ValueError("secret_env needs the private dir of auth_token_path")
        _freeze(
            self,
            entrypoint=tuple(self.entrypoint),
            runtime_env=dict(self.runtime_env),
            secret_env=dict(self.secret_env),
        )

    @property
    def env_vars(self) -> Mapping[str, str]:
        return self.runtime_env.get("env_vars", {})

    @property
    def env_file(self) -> str | None:
        """Where `secret_env` goes: beside the run's token."""
        if not self.secret_env or self.auth_token_path is None:
            return None
        return job_env_path(self.auth_token_path)

    @property
    def secrets(self) -> dict[str, str]:
        """Every secret value of the job, wherever it travels (to scrub them from its logs)."""
        return {**self.env_vars, **self.secret_env}

    def commands(self) -> tuple[Command, ...]:
        argv = ("ray", "job", "submit", "--address", self.address)
        argv += ("--runtime-env-json", runtime_env_json(self.runtime_env), "--", *self.entrypoint)
        env = token_auth_env(self.auth_token_path) if self.auth_token_path else {}
        return (Command(argv, env),)

    def render(self) -> str:
        submit = super().render()
        if self.env_file is None:
            return submit
        content = json.dumps(redact_env(self.secret_env), sort_keys=True, separators=(",", ":"))
        write = f"(umask 077 && cat > {shlex.quote(self.env_file)}) <<'EOF'"
        return f"{write}\n{content}\nEOF\n{submit}"

    def redacted(self) -> RayJobSubmit:
        runtime_env = dict(self.runtime_env)
        if "env_vars" in runtime_env:
            runtime_env["env_vars"] = redact_env(self.env_vars)
        return dataclasses.replace(
            self, runtime_env=runtime_env, secret_env=redact_env(self.secret_env)
        )


@dataclass(frozen=True)
class Shell(Step):
    """A plain command (no shell: `argv` runs as is), optionally in `cwd` with extra `env`."""

    kind: ClassVar[str] = "shell"
    argv: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("a shell step needs a command")
        _freeze(self, argv=tuple(self.argv), env=dict(self.env))

    def commands(self) -> tuple[Command, ...]:
        return (Command(self.argv, self.env, self.cwd),)

    def redacted(self) -> Shell:
        return dataclasses.replace(self, env=redact_env(self.env))


@dataclass(frozen=True)
class WriteFile(Step):
    """Write `content` to `path` (its folder made), with permission bits `mode`."""

    kind: ClassVar[str] = "write_file"
    path: str
    content: str
    mode: int = 0o644

    def commands(self) -> tuple[Command, ...]:
        return ()

    def render(self) -> str:
        quoted = shlex.quote(self.path)
        return (
            f"mkdir -p {shlex.quote(self.path.rsplit('/', 1)[0] or '/')}\n"
            f"cat > {quoted} <<'EOF'\n{self.content.rstrip()}\nEOF\n"
            f"chmod {self.mode:o} {quoted}"
        )


@dataclass(frozen=True)
class VerifyBundle(Step):
    """Check every file of the bundle at `path` against its manifest, size and sha256
    (`harness.bundle_manifest.verify`): a missing or damaged one is one line, exit 2. Live,
    the launch has hashed them all while it built its plan (`harness.bundle_launch`); the
    step then checks that each is still there with its size, without hashing a model twice."""

    kind: ClassVar[str] = "verify_bundle"
    path: str
    checkout: str

    def commands(self) -> tuple[Command, ...]:
        argv = ("python3", "-m", "harness.bundle", "verify", self.path)
        return (Command(argv, cwd=self.checkout),)


def train_py_argv(step: Step) -> tuple[str, ...] | None:
    """The argv after ``python3 train.py`` when `step` runs the trainer, else None."""
    argv = step.entrypoint if isinstance(step, RayJobSubmit) else None
    if isinstance(step, Shell):
        argv = step.argv
    if argv and len(argv) >= 2 and argv[0] in ("python3", "python") and argv[1] == "train.py":
        return tuple(argv[2:])
    return None
