"""`kernels`: FlashInfer's compiled kernels packed on one node, carried through a wheelhouse
build and install like any wheel, and found where FlashInfer looks for its AOT cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wheelhouse.__main__ import main
from wheelhouse.inventory import inventory

VERSION = "0.6.15.post1"
KERNEL = "batch_decode_with_kv_cache_dtype_q_bf16_head_dim_qk_128"


def flashinfer_cache(home: Path) -> Path:
    """A node's cache after one engine: a compiled kernel, a lock folder, one left half-built."""
    ops = home / ".cache" / "flashinfer" / VERSION / "90a" / "cached_ops"
    (ops / KERNEL).mkdir(parents=True)
    (ops / KERNEL / f"{KERNEL}.so").write_bytes(os.urandom(4096))
    (ops / KERNEL / "build.ninja").write_text("rule nvcc\n")
    (ops / "tmp").mkdir()
    (ops / "half_built").mkdir()
    (ops / "half_built" / "prefill.cuda.o").write_bytes(b"\0")
    return ops


def test_packed_kernels_travel_as_a_wheel_to_flashinfers_aot_folder(
    tmp_path: Path, monkeypatch, capsys, pip_offline
):
    ops = flashinfer_cache(tmp_path / "home")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "home"))

    assert main(["kernels", "-o", str(tmp_path / "built")]) == 0
    wheel = f"flashinfer_jit_cache-{VERSION}+sm90a-py3-none-linux_x86_64.whl"
    assert f"packed 1 kernels of FlashInfer {VERSION} for 90a" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "built").iterdir()] == [wheel]

    (tmp_path / "node.json").write_text(json.dumps(inventory()))  # this machine as the node
    pin = f"flashinfer-jit-cache=={VERSION}+sm90a"
    build = ["build", "--inventory", str(tmp_path / "node.json"), "--no-deps", "--no-index"]
    build += ["--find-links", str(tmp_path / "built"), pin, "-o", str(tmp_path / "wh")]
    assert main(build) == 0
    site = tmp_path / "site"
    assert main(["install", str(tmp_path / "wh" / "batch-1"), "--target", str(site)]) == 0

    kernels = site / "flashinfer_jit_cache" / "jit_cache"
    library = kernels / KERNEL / f"{KERNEL}.so"  # where FlashInfer's JitSpec.aot_path looks
    assert library.read_bytes() == (ops / KERNEL / f"{KERNEL}.so").read_bytes()
    assert sorted(p.name for p in kernels.iterdir()) == [KERNEL]

    def served(capability: tuple[int, int] | None) -> tuple[str, str]:
        """(version, AOT folder) as FlashInfer reads them on a node whose GPU NVML reports."""
        path = [str(site)]
        if capability is not None:
            nvml = tmp_path / f"nvml-{capability[0]}{capability[1]}"
            nvml.mkdir()
            (nvml / "pynvml.py").write_text(stand_in_nvml(capability))
            path.append(str(nvml))
        probe = "import flashinfer_jit_cache as c; print(c.__version__, c.get_jit_cache_dir())"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        version, folder = run.stdout.split()
        return version, folder

    version, folder = served((9, 0))  # an H100 or H200
    assert version.startswith(VERSION)  # FlashInfer refuses a cache of another version
    assert folder == str(kernels)
    assert served(None)[1] == str(kernels)  # NVML cannot tell: the kernels
    assert not Path(served((8, 0))[1]).exists()  # another architecture: FlashInfer compiles


def stand_in_nvml(capability: tuple[int, int]) -> str:
    """A `pynvml` module whose one GPU has this compute capability."""
    return f"""
class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetCudaComputeCapability(handle):
    return {capability!r}
"""


def test_a_node_without_compiled_kernels_is_one_line_and_exit_2(tmp_path: Path, capsys):
    (tmp_path / "cache" / VERSION / "90a" / "cached_ops" / "tmp").mkdir(parents=True)
    assert main(["kernels", "--cache", str(tmp_path / "cache"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no compiled FlashInfer kernels under" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("arch", "archs", "local"), [("90a", ("90",), "sm90a"), ("80_90a", ("80", "90"), "sm80.sm90a")]
)
def test_each_architecture_flashinfer_compiled_for_is_served(tmp_path: Path, arch, archs, local):
    from wheelhouse.kernels import compiled_kernels, pack

    ops = tmp_path / VERSION / arch / "cached_ops" / KERNEL
    ops.mkdir(parents=True)
    (ops / f"{KERNEL}.so").write_bytes(b"so")
    (found,) = compiled_kernels(tmp_path)
    assert found.archs == archs
    (line,) = pack(tmp_path, tmp_path / "out")
    assert f"flashinfer_jit_cache-{VERSION}+{local}-py3-none-" in line


def test_a_node_that_started_with_the_wheel_packs_its_kernels_and_the_new_ones(
    tmp_path: Path, capsys
):
    """The node loaded the wheel's kernels and compiled only the rest into its cache: the
    next wheel holds both, the cache's copy where both have one."""
    from wheelhouse.kernels import packed_kernels

    earlier = tmp_path / "earlier"
    ops = tmp_path / "cache" / VERSION / "90a" / "cached_ops"
    for name, data in [(KERNEL, b"old decode"), ("norm", b"norm")]:
        (ops / name).mkdir(parents=True)
        (ops / name / f"{name}.so").write_bytes(data)
    assert main(["kernels", "--cache", str(tmp_path / "cache"), "-o", str(earlier)]) == 0
    (wheel,) = earlier.iterdir()
    carried = wheel.rename(earlier / "flashinfer_jit_cache_sm90a.whl")  # renamed for the trip

    e4m3 = "batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_e4m3_head_dim_qk_128"
    node = tmp_path / "node" / VERSION / "90a" / "cached_ops"
    for name, data in [(e4m3, b"e4m3 prefill"), (KERNEL, b"new decode")]:
        (node / name).mkdir(parents=True)
        (node / name / f"{name}.so").write_bytes(data)
    argv = ["kernels", "--cache", str(tmp_path / "node"), "--add", str(carried)]
    assert main([*argv, "-o", str(tmp_path / "next")]) == 0

    assert f"packed 3 kernels of FlashInfer {VERSION} for 90a" in capsys.readouterr().out
    (packed,) = (tmp_path / "next").iterdir()
    kernels = packed_kernels(packed)
    assert (kernels.version, kernels.arch) == (VERSION, "90a")
    assert kernels.libraries == {e4m3: b"e4m3 prefill", KERNEL: b"new decode", "norm": b"norm"}


def test_adding_a_wheel_this_command_did_not_pack_is_one_line_and_exit_2(tmp_path: Path, capsys):
    from wheelhouse.wheel_file import write_wheel

    official = write_wheel(tmp_path, "flashinfer-jit-cache", f"{VERSION}+cu130", {"x.py": b""})
    cache = tmp_path / "cache"
    ops = cache / VERSION / "90a" / "cached_ops" / KERNEL
    ops.mkdir(parents=True)
    (ops / f"{KERNEL}.so").write_bytes(b"so")
    for wheel in (official, tmp_path / "missing.whl"):
        argv = ["kernels", "--cache", str(cache), "--add", str(wheel)]
        assert main([*argv, "-o", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a readable wheel of `python -m wheelhouse kernels`" in err[0]
        assert not (tmp_path / "out").exists()
