"""Recording is hermetic and free of side effects.

A child process records every launcher with odd values in the variables a launcher could
read, from another working directory, under an audit hook that refuses any process, signal,
network access or file write outside the temp dir. Its recordings must equal this process's
byte for byte and hold no secret. (Whether they equal the stored snapshots is
tests/launchers/test_snapshots.py's question, so that ``--snapshot-update`` is green in one run.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from harness.host import CHECKOUT, FROZEN_ENV
from harness.record import record_all
from harness.snapshot import SNAPSHOT_ROOT

SECRET = "sk-odd-secret-9f8e7d6c"
ODD_ENV = {
    "HIP_VISIBLE_DEVICES": "7,3",
    "CUDA_VISIBLE_DEVICES": "5",
    "ROCR_VISIBLE_DEVICES": "",
    "RAY_ADDRESS": "http://10.9.8.7:8265",
    "SLURM_JOB_NUM_NODES": "13",
    "SLURM_JOB_NODELIST": "odd[1-13]",
    "MASTER_ADDR": "10.1.2.3",
    "WANDB_API_KEY": SECRET,
    "HF_TOKEN": SECRET,
    "NCCL_SOCKET_IFNAME": "odd0",
    "PYTHONPATH": "/odd/path",
    "GRPO_LAUNCHER_LORA_RANK": "3",
    "PYTHONDONTWRITEBYTECODE": "1",
}

CHILD = textwrap.dedent(
    """
    import json, os, sys, tempfile

    TMP = os.path.realpath(tempfile.gettempdir())
    WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    FORBIDDEN = {
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
        "os.forkpty", "os.kill", "os.killpg", "socket.connect", "socket.bind", "socket.sendto",
        "socket.getaddrinfo", "os.remove", "os.rename", "os.mkdir", "shutil.rmtree",
    }

    def refuse(event, args):
        if event in FORBIDDEN:
            raise RuntimeError(f"record mode side effect: {event}")
        if event == "open" and not isinstance(args[0], int):
            path, mode, flags = args
            writes = any(c in (mode or "") for c in "wax+") or flags & WRITE
            if writes and not os.path.realpath(os.fsdecode(path)).startswith(TMP):
                raise RuntimeError(f"record mode side effect: write {path}")

    sys.addaudithook(refuse)
    from harness.record import record_all

    texts = {r.snapshot_name: r.text for r in record_all()}

    def refused(attempt):
        try:
            attempt()
        except RuntimeError:
            return True
        return False

    import subprocess
    guarded = refused(lambda: open(os.devnull, "w")) and refused(lambda: subprocess.run(["true"]))
    print(json.dumps({"guarded": guarded, "texts": texts}))
    """
)


def test_recordings_ignore_the_host_and_have_no_side_effects(tmp_path):
    cwd = tmp_path / "another dir" / "deeper"
    cwd.mkdir(parents=True)
    env = {**os.environ, **ODD_ENV, "HOME": str(tmp_path / "odd home")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=cwd,
        env={**env, "PYTHONPATH": f"{CHECKOUT}{os.pathsep}{env['PYTHONPATH']}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)
    assert child["guarded"], "the audit hook must refuse writes and processes"
    here = {r.snapshot_name: r.text for r in record_all()}
    assert child["texts"] == here
    assert here and all(SECRET not in text for text in here.values())


def test_no_snapshot_holds_a_secret_value():
    snapshots = list(SNAPSHOT_ROOT.rglob("*.txt"))
    assert snapshots
    for path in snapshots:
        text = path.read_text()
        for value in FROZEN_ENV.values():
            assert value not in text, f"{path} leaks a frozen secret"
        assert "--wandb-key" not in text
