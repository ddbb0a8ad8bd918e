"""What a launcher may know about the machine it runs on: the host view.

Two hosts exist. `record_host()` is hermetic: a frozen environment, placeholder paths, a frozen
run id and no probing, so a recording depends only on the launcher and its arguments.
`local_host()` is this machine: its environment, home, checkout, clock and GPUs.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from harness.hardware import Vendor

CHECKOUT = str(Path(__file__).resolve().parent.parent)

RECORD_CHECKOUT = "/__checkout__"
RECORD_HOME = "/__home__"
RECORD_RUN_ID = "frozen-run-id"
# The only variables a recording sees. The fake key makes recordings show the wandb path; its
# value never appears (secrets are redacted).
FROZEN_ENV = MappingProxyType({"WANDB_API_KEY": "frozen-wandb-api-key"})

_VISIBILITY_VARS: dict[Vendor, tuple[str, ...]] = {
    "amd": ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
    "nvidia": ("CUDA_VISIBLE_DEVICES",),
    "cpu": (),
}
_PROBE_TIMEOUT_S = 30


@dataclass(frozen=True)
class HostView:
    """The environment, paths, run id and GPU probe a launcher sees.

    `detect` returns a description of the node's GPUs (``AMD Instinct MI355X``) or None when it
    finds none; a host without `detect` (the record host) is never probed.
    """

    env: Mapping[str, str]
    home: str
    checkout: str
    cwd: str
    run_id: str
    detect: Callable[[], str | None] | None = field(default=None, compare=False)

    def path(self, value: str) -> str:
        """`value` as an absolute path of this host: ``~`` is its home, relative is its cwd."""
        if value == "~" or value.startswith("~/"):
            value = self.home + value[1:]
        return os.path.normpath(os.path.join(self.cwd, value))

    def visible_devices(self, vendor: Vendor) -> tuple[str, int] | None:
        """(variable, count) of the device-visibility variable that restricts `vendor` GPUs."""
        for name in _VISIBILITY_VARS[vendor]:
            if name in self.env:
                value = self.env[name].strip()
                return name, len([d for d in value.split(",") if d.strip()])
        return None

    def visible_device_ids(self, vendor: Vendor) -> str | None:
        """The ids the device-visibility variable of `vendor` names (``2,5``), or None."""
        for name in _VISIBILITY_VARS[vendor]:
            if name in self.env:
                return ",".join(d.strip() for d in self.env[name].split(",") if d.strip())
        return None


def record_host() -> HostView:
    return HostView(
        env=FROZEN_ENV,
        home=RECORD_HOME,
        checkout=RECORD_CHECKOUT,
        cwd=RECORD_CHECKOUT,
        run_id=RECORD_RUN_ID,
    )


def local_host() -> HostView:
    return HostView(
        env=dict(os.environ),
        home=str(Path.home()),
        checkout=CHECKOUT,
        cwd=os.getcwd(),
        run_id=datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        detect=detect_gpus,
    )


def detect_gpus() -> str | None:
    """Describe this node's GPUs with amd-smi, rocm-smi or nvidia-smi, else torch; None if none."""
    for argv in (
        ("amd-smi", "static", "--asic", "--json"),
        ("rocm-smi", "--showproductname", "--json"),
        ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader"),
    ):
        if shutil.which(argv[0]) and (output := _run(argv)):
            return output
    if not (Path("/dev/kfd").exists() or Path("/dev/nvidiactl").exists()):
        return None
    return _torch_device_name()


def _run(argv: tuple[str, ...]) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return _flatten_json(done.stdout)


def _flatten_json(text: str) -> str:
    """JSON tool output as its string values, one per line (plain text passes through)."""
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()
    values: list[str] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            values.append(item)
    return "\n".join(values)


def _torch_device_name() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0)
