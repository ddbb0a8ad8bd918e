"""Platform rules: the environment Ray and the training job need on each vendor's GPUs.

The ROCm rules of the AMD launchers live here and only here (docs/live-mode.md tells users):

- ``RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES`` and ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES``
  default to 1, so Ray does not rewrite the device visibility the caller chose;
- ``HIP_VISIBLE_DEVICES``, when set, is copied into ``CUDA_VISIBLE_DEVICES``, so code that reads
  the CUDA convention (SGLang, torch.cuda) sees the same devices;
- ``NCCL_NVLS_ENABLE`` defaults to 0: RCCL has no NVLink SHARP, and it skips the NVIDIA topology
  probe.

"Default" means a value the host already sets wins.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.hardware import Hardware

ROCM_DEFAULTS = {
    "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
    "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
    "NCCL_NVLS_ENABLE": "0",
}


def platform_env(hardware: Hardware, host_env: Mapping[str, str]) -> dict[str, str]:
    """Variables to add to both the ``ray start`` environment and the job's runtime env.

    A pure function of the hardware and the host's environment.
    """
    if hardware.vendor == "amd":
        env = {name: host_env.get(name, default) for name, default in ROCM_DEFAULTS.items()}
        if hip_visible := host_env.get("HIP_VISIBLE_DEVICES"):
            env["CUDA_VISIBLE_DEVICES"] = hip_visible
        return env
    if hardware.vendor == "nvidia" and "NCCL_NVLS_ENABLE" in host_env:
        return {"NCCL_NVLS_ENABLE": host_env["NCCL_NVLS_ENABLE"]}
    return {}
