"""The name a launcher's run carries: which launcher, on which devices, which run.

``GRPO_RUN_TAG=<launcher file>@<devices>/<run id>`` is set in the environment of the ``ray
start`` a launcher runs, so every Ray process and job of the run inherits it. The run's files
live in its own private dir (`RunTag.run_dir`, named from the tag): its token, its record, and
Ray's temp dir below it. The part before ``/`` (the *slot*) is the
same for every run of one launcher on one set of devices: a new run may clean up what an
earlier run in its slot left behind, and nothing else. Pure names, no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

TAG_VAR = "GRPO_RUN_TAG"
OUTPUT_LOCK = ".launcher.lock"  # in a run's output dir: the live launcher writing it holds it
JOB_ENV_FILE = "job_env"  # beside a run's token: the job's secret variables (JSON, mode 0600)
TEMP_ROOT = "/tmp"  # short on purpose: Ray's socket paths under it must stay below 107 bytes


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class RunTag:
    """`launcher` file, `devices` (``cpu``, ``all`` or ids such as ``2,5``) and `run_id`."""

    launcher: str
    devices: str
    run_id: str

    @classmethod
    def parse(cls, tag: str) -> RunTag:
        slot, sep, run_id = tag.rpartition("/")
        launcher, at, devices = slot.rpartition("@")
        if not (sep and at and launcher and devices and run_id):
            raise ValueError(f"not a run tag: {tag!r} (<launcher>@<devices>/<run id>)")
        return cls(launcher, devices, run_id)

    @property
    def slot(self) -> str:
        return f"{self.launcher}@{self.devices}"

    def __str__(self) -> str:
        return f"{self.slot}/{self.run_id}"

    @property
    def slot_prefix(self) -> str:
        """Every temp dir of this slot starts with this."""
        return f"{TEMP_ROOT}/grpo-{_digest(self.slot)}-"

    @property
    def lock_path(self) -> str:
        """The slot's lock, which a live launcher holds from before its claim to its end."""
        return self.slot_prefix + "lock"

    @property
    def run_dir(self) -> str:
        """This run's private dir (mode 0700, created by the run's claim). Its name is
        predictable, so the claim creates it exclusively and refuses one it did not create."""
        return self.slot_prefix + _digest(self.run_id)

    @property
    def temp_dir(self) -> str:
        """This run's Ray temp dir (``ray start --temp-dir``), ``r`` inside `run_dir`: Ray makes
        its temp dir world-writable, so only the private dir around it keeps others out. Short:
        Ray's socket paths under it must stay below 107 bytes."""
        return f"{self.run_dir}/r"

    @property
    def token_path(self) -> str:
        """The run's Ray authentication token (a file only its owner reads; never a value in
        argv, environment or recordings), in `run_dir`, whose mode Ray leaves alone."""
        return f"{self.run_dir}/auth_token"

    @property
    def device_ids(self) -> frozenset[str] | None:
        """The requested GPU ids: empty on CPU, None for all of the node's."""
        if self.devices == "cpu":
            return frozenset()
        if self.devices == "all":
            return None
        return frozenset(self.devices.split(","))
