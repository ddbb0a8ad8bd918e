"""Live: the kernels FlashInfer compiled on this node, packed by ``python -m wheelhouse kernels``
and installed like any carried wheel, are where FlashInfer looks first and load as they are, so
a node with that wheel starts its engines without compiling them.

    pytest -m cuda_gpu tests/manual/test_flashinfer_kernels.py

Run it after something compiled FlashInfer's kernels on the node (the production job, the
benchmark with ``--sglang-attention-backend flashinfer``); it skips before. Needs FlashInfer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from wheelhouse.__main__ import main
from wheelhouse.inventory import inventory
from wheelhouse.kernels import compiled_kernels, flashinfer_cache

PROBE = """
import json, sys
import tvm_ffi
from flashinfer.jit import env
from flashinfer.jit.core import JitSpec

report = {"aot_dir": str(env.FLASHINFER_AOT_DIR), "loaded": []}
for name in json.loads(sys.argv[1]):
    spec = JitSpec(name, [], None, None, None, None)
    assert spec.is_aot, name
    tvm_ffi.load_module(str(spec.aot_path))
    report["loaded"].append(name)
print(json.dumps(report))
"""


@pytest.mark.cuda_gpu
def test_flashinfer_loads_the_packed_kernels_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("FlashInfer is not installed")
    # The suite gives every test a HOME of its own; the kernels are in this account's home,
    # where its engines compiled them (on a node, 2026-12-06, the test skipped without this).
    account_home = pwd.getpwuid(os.getuid()).pw_dir
    monkeypatch.setenv(
        "FLASHINFER_WORKSPACE_BASE", os.environ.get("FLASHINFER_WORKSPACE_BASE", account_home)
    )
    found = compiled_kernels(flashinfer_cache())
    if not found:
        pytest.skip(f"nothing compiled under {flashinfer_cache()} yet: run an engine first")
    assert main(["kernels", "-o", str(tmp_path / "built")]) == 0
    (tmp_path / "node.json").write_text(json.dumps(inventory()))
    (wheel,) = (tmp_path / "built").glob("*.whl")
    pin = "flashinfer-jit-cache==" + wheel.name.split("-")[1]
    build = ["build", "--inventory", str(tmp_path / "node.json"), "--no-deps", "--no-index"]
    build += ["--find-links", str(tmp_path / "built"), pin, "-o", str(tmp_path / "wh")]
    assert main(build) == 0
    site = tmp_path / "site"
    assert main(["install", str(tmp_path / "wh" / "batch-1"), "--target", str(site)]) == 0

    names = sorted(found[0].libraries)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(names)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"{len(names)} kernels loaded from {report['aot_dir']}")
    assert report["aot_dir"] == str(site / "flashinfer_jit_cache" / "jit_cache")
    assert report["loaded"] == names
