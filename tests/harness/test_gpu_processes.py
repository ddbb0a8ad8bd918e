"""Which GPUs a process holds, from the vendor's GPU tool: how ownership judges a process of
another user, whose environment (and so its visibility variable) it cannot read."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.gpu_processes import gpu_processes
from harness.host import CHECKOUT

AMD_SMI = [  # amd-smi process --json (ROCm 6.x and 7.x): a sentence where a GPU runs nothing
    {"gpu": 0, "process_list": [{"process_info": "No running processes detected"}]},
    {"gpu": 1, "process_list": [{"process_info": {"name": "python3", "pid": 4242}}]},
    {
        "gpu": 2,
        "process_list": [
            {"process_info": {"name": "python3", "pid": 4242, "mem_usage": {"value": 1}}},
            {"process_info": {"name": "sglang", "pid": 77}},
        ],
    },
]
ROCM_SMI = """\
============================ GPUs Indexed by PID ============================
PID 4242 is using 2 DRM device(s):
1 2
PID 77 is using 0 DRM device(s)
=============================================================================
"""
NVIDIA_APPS = "4242, GPU-aaaa\n4242, GPU-cccc\n77, GPU-bbbb\n"
NVIDIA_GPUS = "0, GPU-bbbb\n1, GPU-aaaa\n2, GPU-cccc\n"


def install_tool(directory: Path, name: str, outputs: dict[str, str]) -> None:
    """An executable `name` in `directory` that prints `outputs[its first argument]` (with
    shell builtins only: the tests run it with nothing else on PATH)."""
    cases = "".join(f"  {arg}) printf %s {shlex.quote(text)} ;;\n" for arg, text in outputs.items())
    script = directory / name
    script.write_text(f'#!/bin/sh\ncase "$1" in\n{cases}  *) exit 2 ;;\nesac\n')
    script.chmod(0o755)


@pytest.mark.parametrize(
    ("tool", "outputs", "held"),
    [
        ("amd-smi", {"process": json.dumps(AMD_SMI) + "\n"}, {4242: {"1", "2"}, 77: {"2"}}),
        ("rocm-smi", {"--showpidgpus": ROCM_SMI}, {4242: {"1", "2"}, 77: set()}),
        (
            "nvidia-smi",
            {
                "--query-compute-apps=pid,gpu_uuid": NVIDIA_APPS,
                "--query-gpu=index,uuid": NVIDIA_GPUS,
            },
            {4242: {"1", "2"}, 77: {"0"}},
        ),
    ],
)
def test_each_tool_says_which_gpus_each_process_holds(tool, outputs, held, tmp_path, monkeypatch):
    install_tool(tmp_path, tool, outputs)
    monkeypatch.setenv("PATH", str(tmp_path))  # this tool and no other, whatever the node has
    assert gpu_processes() == {pid: frozenset(ids) for pid, ids in held.items()}


def test_no_tool_no_answer(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_processes() is None
    install_tool(tmp_path, "nvidia-smi", {})  # installed, but it fails (no driver)
    assert gpu_processes() is None


AS_NOBODY = (
    shutil.which("setpriv") or "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
)
HOLDERS = """
import json, sys
from harness import ownership
from harness.run_tag import RunTag
seen = ownership.processes()
target = [s for s in seen if s.process.pid == int(sys.argv[1])]
assert target and target[0].environ is None, "its environment should be unreadable"
holders = {
    devices: ownership.foreign_holders(RunTag("/l.py", devices, "r"), seen)
    for devices in ("0,2", "1")
}
print(json.dumps({devices: [int(h.split()[1]) for h in hs] for devices, hs in holders.items()}))
"""


def test_another_users_process_holds_only_the_gpus_the_tool_names():
    """Seen by another user (uid 65534), this suite's `python3 train.py` has an unreadable
    environment: it holds GPU 1 for the GPU tool, so GPUs 0 and 2 are free; without any tool
    it may hold all."""
    trainer = subprocess.Popen(["bash", "-c", 'exec -a "python3 train.py --unrelated" sleep 600'])
    shared = Path(tempfile.mkdtemp(prefix="gpu-tools-"))  # pytest's tmp_path is root's alone
    shared.chmod(0o755)
    tools = shared / "bin"
    tools.mkdir()
    install_tool(
        tools,
        "nvidia-smi",
        {
            "--query-compute-apps=pid,gpu_uuid": f"{trainer.pid}, GPU-aaaa\n",
            "--query-gpu=index,uuid": NVIDIA_GPUS,
        },
    )

    def holders(path: str) -> dict[str, list[int]]:
        done = subprocess.run(
            [*AS_NOBODY, sys.executable, "-c", HOLDERS, str(trainer.pid)],
            cwd=CHECKOUT,
            env={"PATH": path, "PYTHONPATH": CHECKOUT, "HOME": str(shared)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    try:
        with_tool = holders(f"{tools}{os.pathsep}{os.environ['PATH']}")
        assert trainer.pid not in with_tool["0,2"] and trainer.pid in with_tool["1"]
        without = holders(str(shared))
        assert trainer.pid in without["0,2"] and trainer.pid in without["1"]
    finally:
        trainer.kill()
        trainer.wait()
        shutil.rmtree(shared)


@pytest.mark.cuda_gpu
def test_nvidia_smi_names_the_gpu_a_cuda_process_holds():
    """The real tool on an NVIDIA node: a process computing on CUDA device 0 holds that GPU
    (its nvidia-smi index: the first of CUDA_VISIBLE_DEVICES, else 0)."""
    code = "import time, torch; torch.ones(1, device='cuda:0'); print('ready', flush=True)"
    code += "; time.sleep(120)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        held = gpu_processes()
    finally:
        holder.kill()
        holder.wait()
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    assert held is not None and held.get(holder.pid) == frozenset({first}), held
