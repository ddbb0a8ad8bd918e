"""Fixtures of the harness and launcher tests, and the environment every test runs in."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator

import pytest

from harness.snapshot import LauncherSnapshotExtension, missing_snapshot
from tests.support.private_ray import PrivateRay


def pytest_addoption(parser: pytest.Parser) -> None:
    """The manual GPU tests' split runs (tests/manual/test_cuda_production.py): a job longer than
    one sitting runs as two commands, its first run and then its resume, in a folder kept
    between them."""
    group = parser.getgroup("gpu runs")
    group.addoption(
        "--gpu-run-dir",
        default=None,
        metavar="DIR",
        help="production GPU tests: their model, data, outputs and logs in DIR (kept), not a "
        "temporary folder",
    )
    group.addoption(
        "--gpu-run-phase",
        choices=("whole", "first", "resume"),
        default="whole",
        help="production GPU tests: the whole job (default), only its first run up to the "
        "interrupt, or only the resume of that run and the checks (both need --gpu-run-dir)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that take the CPU launcher's slot (`cpu_launcher_slot`) run in turn anyway, and
    are the suite's longest: they run first, back to back. Under ``pytest -n 2`` xdist's load
    scheduling hands each worker a first chunk of consecutive tests (a quarter of its share), so
    they land on one worker and the other runs the rest, instead of waiting on the slot's lock
    (pytest-xdist's ``--dist loadgroup`` would say so by marker, but with pytest 9.2 it no longer
    groups: it renames ``item._nodeid``, which pytest's node ids stopped reading)."""
    items.sort(key=lambda item: "cpu_launcher_slot" not in getattr(item, "fixturenames", ()))


@pytest.fixture
def launcher_snapshot(snapshot, request):
    """The stored snapshot of a recording name (plain text under tests/snapshots/), via syrupy.

    Without ``--snapshot-update`` a missing file fails with its path and the command that
    writes it.
    """
    stored = snapshot.use_extension(LauncherSnapshotExtension)
    updating = request.config.option.update_snapshots

    def expected(name: str):
        if not updating and (reason := missing_snapshot(name)):
            pytest.fail(reason, pytrace=False)
        return stored(name=name)

    return expected


@pytest.fixture
def cpu_launcher_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """This host's one slot for a live run of the CPU launcher, taken in turn by the tests
    that run it (in parallel xdist workers): the launcher's claim refuses a second run of it
    on the same devices while one is in progress. A lock in the session's own temp dir, which
    the workers share (pytest-xdist gives each a folder below it)."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(folder / "cpu-launcher-live.lock", flags, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # releases the lock


@pytest.fixture
def private_ray():
    """A local Ray of this test's own (temp dir, ports, tag), stopped even when the test fails."""
    cluster = PrivateRay()
    try:
        yield cluster
    finally:
        cluster.cleanup()


# What a user's shell may export that changes what the launchers, Ray, torch.distributed, wandb
# or the Hub client do: a Slurm allocation, a Ray cluster (RAY_ADDRESS) or Ray's settings, the
# launchers' own options (GRPO_LAUNCHER_*), a distributed job's place, visible GPUs.
USER_PREFIXES = ("SLURM_", "RAY_", "GRPO_", "WANDB_", "HF_", "NCCL_", "TORCHELASTIC_")
USER_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
VISIBILITY = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
GPU_MARKERS = ("rocm_gpu", "cuda_gpu")


@pytest.fixture(autouse=True, scope="session")
def pinned_environment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The suite passes wherever a user runs it: inside a Slurm allocation, with a Ray address,
    cluster or GPU variables exported, from any directory, with an unwritable HOME.

    Every test (and what it starts) runs without the user's variables above and with a HOME of
    its own (Ray, pip and the Hub write there; a ``~/.ray/auth_token`` would turn token
    authentication on for every Ray); a test that depends on one sets it. The GPU suites keep
    the visible devices the user chose.
    """
    keep = VISIBILITY if _runs_gpu_tests(request.session) else ()
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            mine = name.startswith(USER_PREFIXES) or name in (*USER_NAMES, *VISIBILITY)
            if mine and name not in keep:
                patch.delenv(name)
        patch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
        yield


def _runs_gpu_tests(session: pytest.Session) -> bool:
    return any(marker in item.keywords for item in session.items for marker in GPU_MARKERS)
