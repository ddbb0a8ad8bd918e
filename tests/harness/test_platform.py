"""The ROCm rules of harness.platform, and where they reach the launch."""

from __future__ import annotations

import pytest

from harness.context import build_plan
from harness.hardware import get_hardware
from harness.host import HostView
from harness.platform import platform_env
from harness.steps import RayJobSubmit, RayStart
from launchers.amd.run_qwen3_4b_lora import LAUNCHER as AMD

MI355X = get_hardware("MI355X")
NOSET_HIP = "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


def test_rocm_defaults():
    assert platform_env(MI355X, {}) == {NOSET_HIP: "1", NOSET_CUDA: "1", "NCCL_NVLS_ENABLE": "0"}


def test_rocm_defaults_do_not_override_the_host():
    host = {NOSET_HIP: "0", NOSET_CUDA: "", "NCCL_NVLS_ENABLE": "1"}
    assert platform_env(MI355X, host) == host


def test_hip_visible_devices_is_copied_into_cuda_visible_devices():
    host = {"HIP_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "0"}
    env = platform_env(get_hardware("MI300X"), host)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert host == {"HIP_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "0"}, "host untouched"
    assert "CUDA_VISIBLE_DEVICES" not in platform_env(MI355X, {"HIP_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("name", ["H100", "H200", "B200"])
def test_nvidia_keeps_device_visibility_to_ray_and_nvls_to_nccl(name):
    assert platform_env(get_hardware(name), {"HIP_VISIBLE_DEVICES": "0"}) == {}
    assert platform_env(get_hardware(name), {"NCCL_NVLS_ENABLE": "1"}) == {"NCCL_NVLS_ENABLE": "1"}


def test_cpu_needs_nothing():
    assert platform_env(get_hardware("CPU"), {"HIP_VISIBLE_DEVICES": "0"}) == {}


def test_rocm_rules_reach_ray_start_and_the_job():
    host = HostView({"HIP_VISIBLE_DEVICES": "0,1,2,3"}, "/h", "/c", "/c", "r", lambda: "MI355X")
    plan = build_plan(AMD, "train", host=host)
    ray_start = next(s for s in plan.steps if isinstance(s, RayStart))
    job = next(s for s in plan.steps if isinstance(s, RayJobSubmit))
    expected = {
        NOSET_HIP: "1",
        NOSET_CUDA: "1",
        "NCCL_NVLS_ENABLE": "0",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
    }
    for env in (ray_start.env, job.env_vars):
        assert expected.items() <= env.items()
    assert ray_start.num_gpus == 4
