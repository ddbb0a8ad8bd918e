"""The suite passes wherever a user runs it (tests/conftest.py pins the environment): here, the
tests that read the environment run inside a Slurm allocation's variables, with a Ray address,
GPU visibility and cluster variables exported, from another directory, with an unwritable HOME
and the user's secrets set. Slow (a suite inside the suite): ``pytest -m slow``."""

from __future__ import annotations

import pytest

from harness.host import CHECKOUT
from tests.support.nested_pytest import run_pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

A_USERS_SHELL = {
    # inside a Slurm allocation of two nodes
    "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NODELIST": "gpu[01-02]", "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0",
    # a Ray cluster and a distributed job's variables
    "RAY_ADDRESS": "http://127.0.0.1:9", "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "29511",
    "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "NODE_RANK": "1",
    # visible GPUs, secrets, a launcher option, and a HOME nothing can be written to
    "CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0", "ROCR_VISIBLE_DEVICES": "0",
    "WANDB_API_KEY": "user-wandb-key", "HF_TOKEN": "hf_user_token",
    "GRPO_LAUNCHER_NUM_NODES": "3", "HOME": "/dev/null/home",
}  # fmt: skip

# Each read the environment (the launchers' host view, spawned processes, pip, Ray) and failed
# in such a shell before the environment was pinned.
ENVIRONMENT_READERS = [
    "tests/harness/test_cli.py",
    "tests/harness/test_multi_node.py",
    "tests/harness/test_ownership.py",
    "tests/trainer/job/test_placement.py::test_an_actor_runs_under_the_interpreter_its_flag_names",
    "tests/wheelhouse/test_build.py::test_sdists_are_resolved_carried_and_built_on_the_node",
]


def test_the_tests_that_read_the_environment_pass_in_a_users_shell(tmp_path):
    tests = [f"{CHECKOUT}/{test}" for test in ENVIRONMENT_READERS]
    done = run_pytest("-m", "not slow", *tests, cwd=tmp_path, env=A_USERS_SHELL)  # another dir
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
