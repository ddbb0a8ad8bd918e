"""Ray placement, the pure parts: bundles, devices, resource checks (no Ray started)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from trainer.arguments import parse_args
from trainer.job.placement import (
    PlacementError,
    check_resources,
    local_gpu_index,
    plan_layout,
    resolve_device,
    runtime_env,
)


def args_of(*extra: str):
    return parse_args(["--hf-checkpoint", "m", "--prompt-data", "p.jsonl", *extra]).placement


def test_colocated_ranks_and_engines_share_bundles():
    args = args_of("--actor-num-gpus-per-node", "4", "--rollout-num-gpus-per-engine", "2",
                   "--colocate", "--global-batch-size", "16")  # fmt: skip
    layout = plan_layout(args, "cuda")
    assert layout.num_bundles == 4
    assert layout.train_bundles == (0, 1, 2, 3)
    assert layout.engine_bundles == (0, 2)
    assert layout.bundle == {"CPU": 1.0, "GPU": 1.0} and layout.share == 0.5
    assert layout.needs() == {"CPU": 4.0, "GPU": 4.0}


def test_separate_rollout_devices_follow_the_training_ones():
    args = args_of("--actor-num-nodes", "2", "--actor-num-gpus-per-node", "2",
                   "--rollout-num-gpus", "3", "--global-batch-size", "16")  # fmt: skip
    layout = plan_layout(args, "cpu")
    assert layout.num_bundles == 7
    assert layout.train_bundles == (0, 1, 2, 3)
    assert layout.engine_bundles == (4, 5, 6)
    assert layout.bundle == {"CPU": 1.0} and layout.share == 1.0


def test_auto_device_follows_the_cluster():
    args = args_of("--actor-num-gpus-per-node", "2", "--global-batch-size", "16")
    assert resolve_device(args, {"CPU": 8.0, "GPU": 2.0}) == "cuda"
    assert resolve_device(args, {"CPU": 8.0, "GPU": 1.0}) == "cpu"
    assert resolve_device(args_of("--device", "cpu"), {"GPU": 8.0}) == "cpu"


def test_a_cluster_too_small_is_a_clear_error():
    layout = plan_layout(args_of("--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1",
                                 "--global-batch-size", "16"), "cpu")  # fmt: skip
    check_resources(layout, {"CPU": 3.0})
    with pytest.raises(PlacementError, match=r"3 bundle\(s\) of \{'CPU': 1.0\} \(CPU 2 of 3"):
        check_resources(layout, {"CPU": 2.0})


@pytest.mark.parametrize(
    ("gpu_id", "environ", "index"),
    [
        ("3", {"CUDA_VISIBLE_DEVICES": "3"}, 0),  # Ray narrowed visibility to this GPU
        ("5", {"CUDA_VISIBLE_DEVICES": "4,5,6"}, 1),  # NOSET: all visible, find ours
        ("2", {"HIP_VISIBLE_DEVICES": "0,1,2,3"}, 2),
        ("6", {}, 6),
    ],
)
def test_local_gpu_index(gpu_id, environ, index):
    assert local_gpu_index(gpu_id, environ) == index


ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import os, sys
import ray
from trainer.job.placement import runtime_env

ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")


@ray.remote
def probe():
    return os.environ.get("GRPO_WRAPPED", "-")


wrapped = ray.get(probe.options(**runtime_env(sys.argv[1])).remote())
print("RESULT", wrapped, ray.get(probe.remote()))
"""


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_an_actor_runs_under_the_interpreter_its_flag_names(tmp_path):
    """--rollout-python / --train-python: Ray starts those workers with another interpreter."""
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nGRPO_WRAPPED=1 exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket path limit
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(wrapper)],
        cwd=ROOT,
        env={**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert "RESULT 1 -" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert runtime_env(None) == {}


def test_a_rollout_actor_merges_into_the_base_a_training_actor_lends(tmp_path):
    """`TrainWorker.lend_base` to `RolloutWorker.borrow_base`, the actors' own methods run in
    this process (on the CPU: shared memory where a GPU maps CUDA IPC handles): the engine's
    merger holds the trainer's base tensors, the same memory, not a copy."""
    import torch
    import torch.distributed as dist

    from trainer import tiny
    from trainer.job.placement import RolloutWorker, TrainWorker, free_port

    tiny.build(tmp_path / "model", tmp_path / "data", seed=1)
    config = parse_args([
        "--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", "p.jsonl",
        "--lora-rank", "4", "--lora-serving", "merged", "--colocate", "--colocate-memory",
        "keep", "--rollout-backend", "hf", "--device", "cpu",
    ])  # fmt: skip
    lender = TrainWorker(config, 0, 1, "cpu", 1)
    lender.setup("127.0.0.1", free_port())
    try:
        borrower = RolloutWorker(config, "cpu", 0)
        borrower.borrow_base(lender.lend_base())
        lent = lender.trainer.merged_base()
        borrowed = borrower.engine.merger.base
        assert borrowed.keys() == lent.keys() and lent
        name = next(iter(lent))
        with torch.no_grad():
            lent[name].add_(1.0)
        assert torch.equal(borrowed[name], lent[name])
    finally:
        dist.destroy_process_group()
