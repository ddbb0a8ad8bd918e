"""The CPU launcher's `train`, started live for a test: its own ports, the user's secrets in its
environment (``HF_TOKEN``) and in ``--extra-env``, its output in a log."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from harness.host import CHECKOUT
from tests.support.private_ray import LauncherPorts

# Drawn per run: the checkout (the tests too) is uploaded into Ray's dir as the job's working_dir.
SECRETS = {"HF_TOKEN": f"hf_{uuid.uuid4().hex}", "MY_SERVICE_TOKEN": uuid.uuid4().hex}


def launch(
    tmp_path: Path,
    run_id: str,
    log: Path,
    ports: LauncherPorts,
    *extra: str,
    own_session: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`train` of `run_id` under `tmp_path` (the tiny model and task already built there);
    `own_session`: in a session of its own, as a shell starts a foreground job; `env`: more
    of the user's environment."""
    argv = [
        "train", "--run-id", run_id, "--model-dir", str(tmp_path / "models"),
        "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "outputs"),
        *ports.argv(),
        "--extra-env", f"MY_SERVICE_TOKEN={SECRETS['MY_SERVICE_TOKEN']}", *extra,
    ]  # fmt: skip
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "launchers.cpu.run_tiny_qwen3_lora", *argv],
            cwd=CHECKOUT,
            env={
                **os.environ,
                "PYTHONPATH": CHECKOUT,
                "HF_TOKEN": SECRETS["HF_TOKEN"],
                **(env or {}),
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=own_session,
        )
