"""A run killed with SIGKILL after a checkpoint, started again with the same command, resumes
from that checkpoint: its metrics steps continue exactly, none repeated, none skipped. The kill
is taken to have cut the last metrics.jsonl line short, as a kill in the middle of a write does:
the resumed run drops that line and says so.

Two data-parallel training ranks (gloo), one rollout engine, and a local Ray started by
``train.py`` itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer import tiny
from trainer.run import checkpoint
from trainer.run.metrics import METRICS_FILE, read_metrics

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = 12
SAVE_INTERVAL = 3


def command(tmp_path: Path) -> list[str]:
    model, data, save = tmp_path / "model", tmp_path / "data", tmp_path / "ckpt"
    return [
        sys.executable, "train.py",
        "--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "tiny",
        "--num-rollout", str(ROLLOUTS), "--rollout-batch-size", "8",
        "--n-samples-per-prompt", "8", "--rollout-max-response-len", "4",
        "--global-batch-size", "64", "--micro-batch-size", "32", "--lr", "5e-3",
        "--lora-rank", "8", "--lora-alpha", "16", "--device", "cpu",
        "--actor-num-gpus-per-node", "2", "--rollout-num-gpus-per-engine", "2", "--colocate",
        "--save", str(save), "--load", str(save), "--save-interval", str(SAVE_INTERVAL),
        "--output-dir", str(tmp_path / "out"), "--seed", "0", "--check-adapter-sync",
    ]  # fmt: skip


def test_a_killed_run_resumes_from_its_last_checkpoint(private_ray, tmp_path):
    tiny.build(tmp_path / "model", tmp_path / "data", seed=0)
    env = {**os.environ, **private_ray.env}
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(command(tmp_path), cwd=ROOT, env=env, stdout=log, stderr=log)
    deadline = time.time() + 180
    while checkpoint.latest_iteration(tmp_path / "ckpt") is None:
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.time() < deadline, "no checkpoint within 180 s"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    log.close()
    private_ray.stop()  # the local Ray of the killed driver, whatever survived it

    killed_at = checkpoint.latest_iteration(tmp_path / "ckpt")
    assert killed_at is not None and killed_at < ROLLOUTS
    logged = [r["step"] for r in read_metrics(tmp_path / "out" / METRICS_FILE)]
    assert logged == list(range(len(logged))) and len(logged) >= killed_at
    torn = f'{{"step": {len(logged)}, "rollout/reward_mean": 0.1'
    with (tmp_path / "out" / METRICS_FILE).open("a") as metrics:
        metrics.write(torn)

    second = subprocess.run(
        command(tmp_path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    dropped = f"train.py: {tmp_path / 'out' / METRICS_FILE}: dropping its torn last line {torn!r}"
    assert dropped in second.stdout
    resumed = f"resumed from {tmp_path / 'ckpt' / f'iter_{killed_at:07d}'}"
    assert f"{resumed} (next rollout {killed_at + 1}/{ROLLOUTS})" in second.stdout
    assert f"step {killed_at}/{ROLLOUTS}" not in second.stdout
    assert f"step {killed_at + 1}/{ROLLOUTS}" in second.stdout

    records = read_metrics(tmp_path / "out" / METRICS_FILE)
    assert [r["step"] for r in records] == list(range(ROLLOUTS))
    assert (tmp_path / "out" / METRICS_FILE).read_text().endswith("}\n"), "a torn line is left"
    # Both data-parallel ranks hold rank 0's adapter after every update, and the engine
    # serves it (fp32 on the CPU: equal up to rounding).
    assert all(r["sync/ranks_off_rank0_adapter"] == 0 for r in records)
    synced = [
        r["sync/engine_trainer_logprob_abs_diff"]
        for r in records
        if "sync/engine_trainer_logprob_abs_diff" in r
    ]
    assert len(synced) == ROLLOUTS - 1 and max(synced) < 1e-4  # resumed rollout included
    state = json.loads((tmp_path / "ckpt" / f"iter_{ROLLOUTS:07d}" / "state.json").read_text())
    assert state["rollout_index"] == ROLLOUTS
    assert state["data"] == {  # 12 rollouts x 8 prompts walked once, none twice
        "epoch": 0, "offset": ROLLOUTS * 8, "num_prompts": 256, "shuffle": True, "seed": 0,
    }  # fmt: skip
