"""What a launcher declares: its arguments (a dataclass), its training config, its
entrypoints, its identity.

A launcher's arguments are a frozen dataclass deriving from `LauncherArgs`: launch concerns only
(hardware, nodes, ports, directories, run id, tracking mode), and ``--set NAME=VALUE`` for any
training setting. What it trains is its recipe's `TrainConfig`, a function of those arguments
(their directories and run id). Its entrypoints are functions ``def name(ctx: LaunchContext,
args: Args) -> None`` that emit steps; its module declares ``LAUNCHER = recipe_launcher(
__name__, ...)`` (`harness.recipe`). See docs/adding-a-launcher.md.
"""

from __future__ import annotations

import math
import os
import re
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields
from functools import cached_property
from typing import Any, Literal

from harness.errors import LaunchError
from harness.hardware import get_hardware
from trainer.config.flags import option
from trainer.config.train import TrainConfig

# ``def name(ctx: LaunchContext, args: Args) -> None``; typed loosely so that this module,
# which the context imports, imports nothing of the context.
Entrypoint = Callable[..., None]

_ENV_ITEM = re.compile(r",(?=[A-Za-z_][A-Za-z0-9_]*=)")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# A run id or model name: one path component, safe in a shell word and a file name.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def arg(default: Any, help: str, *, path: bool = False, metavar: str | None = None) -> Any:
    """A launcher field: its default and its ``--help`` text (its value named `metavar`);
    `path` fields are made absolute on the launch host (``~`` is that host's home)."""
    return field(default=default, metadata={"help": help, "path": path, "metavar": metavar})


@dataclass(frozen=True)
class LauncherArgs:
    """Fields every launcher has. A launcher narrows `hardware` to a ``Literal`` of its choices."""

    hardware: str = arg("auto", "GPU model; auto detects it on the node")
    num_nodes: int = arg(
        1,
        "nodes of the Ray cluster: `train` on the head, `worker` on each other node "
        "[in a Slurm allocation: its node count]",
    )
    head_address: str | None = arg(
        None,
        "host name or IP of the head node, for `worker` [in a Slurm allocation: its first node]",
    )
    cluster_timeout: int = arg(
        600, "seconds the head waits for all nodes, and a worker for the head"
    )
    num_gpus_per_node: int | None = arg(
        None, "GPUs per node to use [default: the visible devices, else all of the hardware's]"
    )
    model_dir: str = arg("~/models", "directory of downloaded models", path=True)
    data_dir: str = arg("~/datasets", "directory of downloaded data sets", path=True)
    from_bundle: str | None = arg(
        None,
        "a bundle of the recipe's models and data sets (python -m harness.bundle make; "
        "docs/air-gapped.md): they are read there (DIR/models, DIR/datasets) with the Hub "
        "offline, and prepare checks every file against its manifest instead of downloading",
        path=True,
    )
    output_dir: str = arg(
        "~/outputs", "run outputs; <output-dir>/<run-id> holds checkpoints and metrics", path=True
    )
    run_id: str | None = arg(None, "name of this run [default: the launch time]")
    ray_address: str | None = arg(
        None, "job server of a running Ray cluster (http://HEAD:8265): submit there, start no Ray"
    )
    ray_port: int = arg(6379, "port of the Ray head this launcher starts")
    dashboard_port: int = arg(8265, "dashboard and job-server port of the Ray head it starts")
    agent_port: int = arg(
        52365, "dashboard agent port of the Ray node it starts (two on one host need two)"
    )
    client_server_port: int = arg(
        10001, "Ray Client server port of the Ray head it starts (two on one host need two)"
    )
    wandb_mode: Literal["online", "offline", "disabled"] = arg(
        "online", "wandb logging; online needs WANDB_API_KEY in the environment"
    )
    set: tuple[str, ...] = arg(
        (),
        "NAME=VALUE: set a training setting of train.py, named by its flag (lora-rank) or its "
        "dotted name (lora.lora_rank), over the recipe's (repeatable; the settings this "
        "recipe chooses are listed below)",
        metavar="NAME=VALUE",
    )
    extra_env: str = arg("", "extra environment of the job: NAME=VALUE[,NAME=VALUE...]")
    pass_env: str = arg(
        "",
        "variables of this environment passed to the job by name: NAME[,NAME...] (their "
        "values stay out of argv and of the Slurm script)",
    )
    image: str | None = arg(
        None,
        "container image of the Ray pods, holding this checkout and its Python environment "
        "[rayjob]",
    )
    image_checkout: str = arg("/app", "where the image holds this checkout [rayjob]")
    pvc: str = arg(
        "",
        "persistent volume claims mounted in every Ray pod: CLAIM:PATH[,CLAIM:PATH...] (the "
        "model, data and output dirs are the pods' paths) [rayjob]",
    )

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise LaunchError(f"{option(item.name)} must be a finite number (got {value})")
            if isinstance(value, str) and not _is_utf8(value):
                text = os.fsencode(value).decode("utf-8", "backslashreplace")
                shown = f" ({text})" if item.metadata.get("path") else ""  # never a secret
                raise LaunchError(f"{option(item.name)} holds a byte that is not UTF-8{shown}")
        if self.num_nodes < 1:
            raise LaunchError(f"--num-nodes must be >= 1 (got {self.num_nodes})")
        if self.cluster_timeout < 1:
            raise LaunchError(f"--cluster-timeout must be >= 1 (got {self.cluster_timeout})")
        if self.num_gpus_per_node is not None and self.num_gpus_per_node < 1:
            raise LaunchError(f"--num-gpus-per-node must be >= 1 (got {self.num_gpus_per_node})")
        for name in ("ray_port", "dashboard_port", "agent_port", "client_server_port"):
            if not 0 < getattr(self, name) < 65536:
                raise LaunchError(f"{option(name)} must be a TCP port (got {getattr(self, name)})")
        if self.run_id is not None and not SAFE_NAME.fullmatch(self.run_id):
            raise LaunchError(
                f"--run-id must be letters, digits, '.', '_' or '-' ({self.run_id!r})"
            )
        if self.ray_address is not None and not self.ray_address.strip():
            raise LaunchError("--ray-address must not be empty")
        _ = self.extra_env_vars, self.pass_env_names

    @property
    def cpus_per_node(self) -> int | None:
        """CPUs each Ray node offers (``ray start --num-cpus``); None: Ray counts the node's.
        A launcher with an option for it returns that option."""
        return None

    @property
    def ranks_per_node(self) -> int | None:
        """Training ranks on each node; None: one per GPU. A launcher for nodes without a GPU
        returns its option for it."""
        return None

    @property
    def extra_env_vars(self) -> dict[str, str]:
        """`extra_env` as a mapping; a value may contain commas (``A=x,y,B=z``)."""
        env: dict[str, str] = {}
        for item in _ENV_ITEM.split(self.extra_env.strip()) if self.extra_env.strip() else []:
            name, eq, value = item.partition("=")
            if not eq or not _ENV_NAME.match(name.strip()):
                raise LaunchError(f"--extra-env items must be NAME=VALUE (got {name.strip()!r})")
            env[name.strip()] = value
        return env

    @property
    def pass_env_names(self) -> tuple[str, ...]:
        """`pass_env` as names."""
        names = tuple(name.strip() for name in self.pass_env.split(",") if name.strip())
        for name in names:
            if not _ENV_NAME.match(name):
                raise LaunchError(f"--pass-env items must be variable names (got {name!r})")
        return names


def _is_utf8(text: str) -> bool:
    """False for a str holding bytes that are not UTF-8 (Python keeps them as surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Launcher:
    """The declaration of a launcher: ``LAUNCHER = recipe_launcher(__name__, ...)`` in its
    module (or ``Launcher(__name__, ...)`` for one whose entrypoints are all its own).

    `module` is the declaring module's ``__name__``: the launcher's identity (its runs' tag,
    its snapshot folder, the module its Slurm script runs), whichever module its entrypoints
    come from; ``__main__`` (under ``python -m``) stands for the module's real name, and its
    docstring gives the command line's summary. `recorded_hardware` is what the snapshots
    represent (`auto` resolves to it when recording); the supported hardware is the
    ``Literal`` of the args' `hardware` field, minus ``auto``. `config` is what it trains:
    the recipe's training config for a launch's args (`harness.run_config` adds the launch's
    own settings). `evidence` says what has shown that the launcher works: its cell of the
    support matrix (`harness.support_matrix`).
    """

    module: str
    _: KW_ONLY
    args: type[LauncherArgs]
    entrypoints: tuple[Entrypoint, ...]
    recorded_hardware: str
    config: Callable[[Any], TrainConfig] | None = None  # the recipe's, for a launch's args
    evidence: str = ""
    # The hermetic recordings (snapshots): name -> (entrypoint, option values). Default: one
    # per entrypoint with default options.
    recordings: Mapping[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)
    doc: str = field(init=False, default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        declared = sys.modules.get(self.module)
        spec = getattr(declared, "__spec__", None)
        if self.module == "__main__" and spec is not None:
            object.__setattr__(self, "module", spec.name)
        object.__setattr__(self, "doc", getattr(declared, "__doc__", None) or "")
        object.__setattr__(self, "entrypoints", tuple(self.entrypoints))
        if not self.recordings:
            defaults = {fn.__name__: (fn.__name__, {}) for fn in self.entrypoints}
            object.__setattr__(self, "recordings", defaults)
        unknown = {e for e, _ in self.recordings.values()} - {f.__name__ for f in self.entrypoints}
        if unknown:
            raise TypeError(f"recordings name unknown entrypoints: {sorted(unknown)}")
        if not self.entrypoints:
            raise TypeError("a launcher needs at least one entrypoint")
        if len(set(self.entrypoint_names)) != len(self.entrypoints):
            raise TypeError(f"entrypoint names repeat: {self.entrypoint_names}")
        get_hardware(self.recorded_hardware)
        if self.recorded_hardware not in self.supported_hardware:
            raise TypeError(
                f"recorded hardware {self.recorded_hardware} is not among the supported "
                f"{self.supported_hardware}"
            )

    @property
    def path(self) -> str:
        """``launchers/amd/run_qwen3_4b_lora``: the module's path, also its snapshot folder."""
        return self.module.replace(".", "/")

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0] if self.doc.strip() else self.module

    @property
    def entrypoint_names(self) -> tuple[str, ...]:
        return tuple(fn.__name__ for fn in self.entrypoints)

    @cached_property
    def supported_hardware(self) -> tuple[str, ...]:
        hint = typing.get_type_hints(self.args)["hardware"]
        if typing.get_origin(hint) is not Literal:
            raise TypeError(f"{self.args.__name__}.hardware must be a Literal of hardware names")
        names = tuple(name for name in typing.get_args(hint) if name != "auto")
        for name in names:
            get_hardware(name)
        return names

    def entrypoint(self, name: str) -> Entrypoint:
        """The entrypoint called `name` (``full_train`` or ``full-train``)."""
        for fn in self.entrypoints:
            if fn.__name__ == name.replace("-", "_"):
                return fn
        raise LaunchError(f"{self.module} has no entrypoint {name!r}")


TWO_NODES: Mapping[str, Any] = {"num_nodes": 2, "head_address": "node-0"}
# A manifest's image and a claim holding the recording's model, data and output dirs.
ON_KUBERAY: Mapping[str, Any] = {
    "image": "registry.example.com/grpo-lora:recorded",
    "pvc": "grpo-data:/__home__",
}


def multi_node_recordings() -> dict[str, tuple[str, Mapping[str, Any]]]:
    """`Launcher.recordings` of a launcher with ``worker``, ``sbatch`` and ``rayjob``:
    prepare, train and full_train with default options, train, worker and sbatch of a 2-node
    cluster, and rayjob of one and of two nodes."""
    return {
        **{name: (name, {}) for name in ("prepare", "train", "full_train")},
        **{f"{name}_2_nodes": (name, TWO_NODES) for name in ("train", "worker", "sbatch")},
        "rayjob": ("rayjob", ON_KUBERAY),
        "rayjob_2_nodes": ("rayjob", {"num_nodes": 2, **ON_KUBERAY}),
    }


def path_fields(args: LauncherArgs) -> list[str]:
    return [f.name for f in fields(args) if f.metadata.get("path")]
