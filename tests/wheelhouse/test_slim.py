"""Slimming keeps a valid RECORD and the slimmed wheel installs with pip."""

from __future__ import annotations

import base64
import csv
import hashlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.wheel_factory import make_wheel
from wheelhouse.batches import WheelhouseError
from wheelhouse.profiles import PROFILES, Rule, rules_for
from wheelhouse.slim import matches, newer_arch_only, parse_arch, slim_wheel

MEMBERS = {
    "kern/__init__.py": b"",
    "kern/ops_sm90a.so": b"hopper",
    "kern/sm100/ops.so": b"blackwell",
    "kern/ops_sm100_sm120.so": b"newer",
    "kern/fused_sm100.py": b"# imported on every GPU\n",
    "kern/data/cutlass/include/cute.h": b"header",
    "kern/gsm8k.json": b"{}",
}


def record_rows(wheel: Path) -> dict[str, tuple[str, str]]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(zf.read(name).decode().splitlines()))
        members = {n: zf.read(n) for n in zf.namelist()}
    for path, digest, size in rows:
        if path == name:
            assert (digest, size) == ("", "")
            continue
        data = members[path]
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={expected}" and int(size) == len(data), path
    assert {r[0] for r in rows} == set(members)
    return {r[0]: (r[1], r[2]) for r in rows}


def test_slimmed_wheel_has_a_valid_record_and_installs(tmp_path):
    src = make_wheel(tmp_path / "src", "kern", "1.0", MEMBERS)
    dst = tmp_path / "slim" / src.name
    dst.parent.mkdir()
    result = slim_wheel(src, dst, Rule(drop=("kern/data/cutlass/",)), arch=parse_arch("sm90"))
    assert result is not None and result.dropped == 3
    kept = record_rows(dst)
    assert "kern/ops_sm90a.so" in kept and "kern/fused_sm100.py" in kept
    assert "kern/gsm8k.json" in kept
    assert not any("sm100/" in n or "sm120" in n or "cutlass" in n for n in kept)
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--target",
            str(site),
            str(dst),
        ],
        check=True,
    )
    assert (site / "kern" / "ops_sm90a.so").read_bytes() == b"hopper"
    assert not (site / "kern" / "sm100").exists()


def test_nothing_to_drop_writes_nothing(tmp_path):
    src = make_wheel(tmp_path / "src", "plain", "1.0")
    assert slim_wheel(src, tmp_path / src.name, Rule(), arch=90) is None
    assert not (tmp_path / src.name).exists()


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils' strip is not installed")
def test_strip_keeps_record_true(tmp_path):
    library = next(Path(sysconfig.get_config_var("DESTSHARED")).glob("_json*.so"))
    src = make_wheel(tmp_path / "src", "native", "1.0", {"native/_json.so": library.read_bytes()})
    dst = tmp_path / src.name
    assert slim_wheel(src, dst, Rule(strip=True)) is not None
    rows = record_rows(dst)
    assert int(rows["native/_json.so"][1]) <= library.stat().st_size


def test_arch_filter_and_profiles():
    assert newer_arch_only("x/sm100/a.so", 90) and newer_arch_only("x/k_sm120a.cubin", 90)
    assert not newer_arch_only("x/k_sm80.so", 90)
    assert not newer_arch_only("x/k_sm90_sm100.so", 90)
    assert not newer_arch_only("x/k_sm100.py", 90)
    assert newer_arch_only("x/sm100/libk.so.12", 90) and newer_arch_only("x/k_sm100.fatbin", 90)
    sources = ("cute/arch/copy_sm100.hpp", "csrc/fmha_sm100.cu", "x/k_sm100.cuh", "k_sm120.jinja")
    for source in sources:
        assert not newer_arch_only(f"flashinfer/data/{source}", 90), source
    assert not newer_arch_only("x/asm100.so", 90)
    with pytest.raises(WheelhouseError, match="--cuda-arch"):
        parse_arch("hopper")
    rules = rules_for(["sglang-triton"])
    assert set(rules) == set(PROFILES["sglang-triton"])
    assert "sgl_kernel/sm100/" in rules["sglang-kernel"].drop and rules["xgrammar"].strip


def test_the_cuda_profile_keeps_what_flashinfers_jit_compile_needs():
    """FlashInfer attention compiles its kernels on the node from its bundled CUTLASS and CCCL
    headers; the CUDA recipe's profile drops the rest of what the Triton profile drops."""
    triton, cuda = rules_for(["sglang-triton"]), rules_for(["sglang-cuda"])
    assert "flashinfer/data/cutlass/" in triton["flashinfer-python"].drop
    assert "flashinfer-python" not in cuda
    assert {k: v for k, v in triton.items() if k != "flashinfer-python"} == cuda


def test_the_fa3_profile_keeps_flash_attention_3_and_drops_the_rest_as_the_cuda_profile():
    """SGLang's default attention on Hopper loads `sgl_kernel.flash_ops`; the FA3 profile keeps
    that one library and otherwise slims as the CUDA recipe's profile does."""
    cuda, fa3 = rules_for(["sglang-cuda"]), rules_for(["sglang-fa3"])
    kernel = fa3["sglang-kernel"]
    assert matches("sgl_kernel/flash_ops.abi3.so", cuda["sglang-kernel"].drop)
    assert not matches("sgl_kernel/flash_ops.abi3.so", kernel.drop)
    assert matches("sgl_kernel/flashmla_ops.abi3.so", kernel.drop) and kernel.strip
    assert {k: v for k, v in fa3.items() if k != "sglang-kernel"} == {
        k: v for k, v in cuda.items() if k != "sglang-kernel"
    }


def test_the_vllm_profile_keeps_hoppers_flash_attention_and_the_dense_kernels(tmp_path):
    """vLLM on SM90 takes FlashAttention 3; FA2, the MoE kernels and the Rust HTTP frontend go."""
    members = {
        "vllm/__init__.py": b"",
        "vllm/_C_stable_libtorch.abi3.so": b"dense ops",
        "vllm/_moe_C_stable_libtorch.abi3.so": b"moe ops",
        "vllm/vllm_flash_attn/flash_attn_interface.py": b"",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3",
        "vllm/vllm-rs": b"frontend",
    }
    src = make_wheel(tmp_path / "src", "vllm", "0.26.0", members)
    dst = tmp_path / "slim" / src.name
    dst.parent.mkdir()
    result = slim_wheel(src, dst, rules_for(["vllm-sm90"])["vllm"], arch=parse_arch("sm90"))
    assert result is not None and result.dropped == 3
    assert set(record_rows(dst)) >= {
        "vllm/_C_stable_libtorch.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/vllm_flash_attn/flash_attn_interface.py",
    }
    assert not {"vllm/vllm-rs", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"} & set(record_rows(dst))
