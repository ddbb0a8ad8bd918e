"""Job-start preflight: versions and devices reported; missing backends, device mismatches stop."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest

from trainer.arguments import parse_args
from trainer.job import preflight
from trainer.job.preflight import Environment, PreflightError

BASE = ["--hf-checkpoint", "/m", "--prompt-data", "/d.jsonl"]
PRODUCTION = [
    *BASE, "--train-backend", "megatron", "--rollout-backend", "sglang", "--colocate",
    "--actor-num-gpus-per-node", "8", "--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
]  # fmt: skip
EIGHT = "0,1,2,3,4,5,6,7"
ALL_INSTALLED = {
    "torch": "2.9.1+rocm7.2.0", "sglang": "0.5.9", "megatron-core": "0.16.1",
    "megatron-bridge": "0.3.1", "transformer-engine": "2.4.0", "transformers": "4.57.1",
    "peft": "0.17.1", "ray": "2.49.2",
}  # fmt: skip


def _mi355x(**changes) -> Environment:
    env = Environment(
        versions=ALL_INSTALLED,
        modules={"transformer_engine": True},
        runtime="ROCm (HIP 7.2.26015)",
        hip=True,
        devices=("AMD Instinct MI355X",) * 8,
        visible={
            "HIP_VISIBLE_DEVICES": EIGHT,
            "CUDA_VISIBLE_DEVICES": EIGHT,
            "ROCR_VISIBLE_DEVICES": None,
        },
    )
    return dataclasses.replace(env, **changes)


def _problems(env: Environment, argv: list[str] = PRODUCTION, expected: int = 8) -> list[str]:
    return preflight.problems(parse_args(argv).placement, env, expected)


def test_a_healthy_mi355x_node_passes_and_is_reported() -> None:
    env = _mi355x()
    assert _problems(env) == []
    lines = preflight.report(env, parse_args(PRODUCTION).placement)
    assert lines == [
        "preflight: backends: train megatron, rollout sglang",
        "preflight: torch 2.9.1+rocm7.2.0, ROCm (HIP 7.2.26015); 8 device(s): AMD Instinct MI355X",
        "preflight: sglang 0.5.9, megatron-core 0.16.1, megatron-bridge 0.3.1, transformer-engine "
        "2.4.0, transformers 4.57.1, peft 0.17.1, ray 2.49.2",
        f"preflight: HIP_VISIBLE_DEVICES={EIGHT}, CUDA_VISIBLE_DEVICES={EIGHT}, "
        "ROCR_VISIBLE_DEVICES=(unset)",
    ]


def test_missing_backend_packages_are_named_per_flag() -> None:
    versions = {**ALL_INSTALLED, "megatron-bridge": None, "sglang": None}
    env = _mi355x(versions=versions, modules={"transformer_engine": False})
    assert _problems(env) == [
        "--train-backend megatron needs megatron-bridge, transformer_engine, not installed in "
        "this Python",
        "--rollout-backend sglang needs sglang, not installed in this Python",
    ]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"visible": {"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": EIGHT,
                         "ROCR_VISIBLE_DEVICES": None}},
            "HIP_VISIBLE_DEVICES=0,1 and CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 disagree",
        ),
        (
            {"visible": {"HIP_VISIBLE_DEVICES": "0,1,2,3", "CUDA_VISIBLE_DEVICES": None,
                         "ROCR_VISIBLE_DEVICES": "4,5"}},
            "visible device(s) 2,3 do not exist among the 2 GPU(s) of ROCR_VISIBLE_DEVICES=4,5",
        ),
        (
            {"devices": ("AMD Instinct MI355X",) * 4,
             "visible": {"HIP_VISIBLE_DEVICES": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                         "ROCR_VISIBLE_DEVICES": None}},
            "the job was given 8 GPU(s) per node (--actor-num-gpus-per-node) but this process "
            "sees 4 (HIP_VISIBLE_DEVICES=0,1,2,3, CUDA_VISIBLE_DEVICES=0,1,2,3)",
        ),
        (
            {"devices": (), "runtime": None, "hip": False},
            "no GPU visible to torch (a CPU-only torch build) but --train-backend megatron",
        ),
    ],
)  # fmt: skip
def test_device_disagreements_stop_the_job(changes: dict, message: str) -> None:
    found = _problems(_mi355x(**changes))
    assert found and found[0].startswith(message)


def test_hip_variables_do_not_matter_on_cuda() -> None:
    env = _mi355x(
        runtime="CUDA 12.8",
        hip=False,
        devices=("NVIDIA H200",) * 8,
        visible={
            "HIP_VISIBLE_DEVICES": "0",
            "CUDA_VISIBLE_DEVICES": EIGHT,
            "ROCR_VISIBLE_DEVICES": None,
        },
    )
    assert _problems(env) == []


def test_a_worker_driving_one_gpu_expects_one() -> None:
    env = _mi355x(devices=("AMD Instinct MI355X",), visible=dict.fromkeys(preflight.VISIBLE_VARS))
    assert _problems(env, expected=1) == []
    assert _problems(env, expected=8)


def test_portable_backends_on_a_cpu_only_host_pass() -> None:
    env = _mi355x(devices=(), runtime=None, hip=False, versions={**ALL_INSTALLED, "sglang": None})
    assert _problems(env, argv=BASE) == []


def test_run_probes_this_host_and_prints_before_judging() -> None:
    lines: list[str] = []
    env = preflight.run(
        parse_args(BASE).placement, environ={"CUDA_VISIBLE_DEVICES": ""}, emit=lines.append
    )
    assert env.visible["CUDA_VISIBLE_DEVICES"] == ""
    assert lines[0] == "preflight: backends: train torch, rollout hf"
    assert lines[1].startswith(f"preflight: torch {env.versions['torch']}")


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is not None, reason="SGLang is installed on this host"
)
def test_run_stops_with_one_line_when_sglang_is_missing() -> None:
    argv = [*BASE, "--rollout-backend", "sglang"]
    lines: list[str] = []
    with pytest.raises(PreflightError, match="--rollout-backend sglang needs sglang") as err:
        preflight.run(parse_args(argv).placement, emit=lines.append)
    assert "\n" not in str(err.value)
    assert len(lines) == 4


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
