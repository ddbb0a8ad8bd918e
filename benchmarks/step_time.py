"""Step time of the tiny GRPO LoRA recipe, several configurations side by side in one run.

Each configuration runs ``python3 train.py`` (local Ray) on the same tiny model and task with
the CPU launcher's own argv plus its extra flags; the report gives, per configuration, the
median and spread of ``time/step`` (the first step, which warms up, left out) and the ratio of
medians to the first configuration.

    python benchmarks/step_time.py                                    # CPU: 1 vs 2 ranks
    python benchmarks/step_time.py --config bf16="--device cuda --dtype bf16" \\
        --config fp32="--device cuda --dtype fp32"                    # on a GPU
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import build_plan
from harness.host import local_host
from harness.steps import train_py_argv
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER
from trainer import tiny
from trainer.run.metrics import METRICS_FILE, read_metrics

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ("1-rank=", "2-ranks=--actor-num-gpus-per-node 2")


def recipe_argv(work: Path, run_id: str, num_rollout: int) -> list[str]:
    args = LAUNCHER.args(
        model_dir=str(work / "models"),
        data_dir=str(work / "data"),
        output_dir=str(work / "outputs"),
        run_id=run_id,
        num_rollout=num_rollout,
    )
    plan = build_plan(LAUNCHER, "train", args, local_host())
    [argv] = [a for a in map(train_py_argv, plan.steps) if a is not None]
    return list(argv)


def with_overrides(argv: list[str], extra: list[str]) -> list[str]:
    """`argv` with each ``--flag value`` of `extra` replacing the flag's value or appended."""
    argv = list(argv)
    index = 0
    while index < len(extra):
        flag, value = extra[index], extra[index + 1]
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        index += 2
    return argv


def run(work: Path, name: str, extra: list[str], num_rollout: int) -> list[float]:
    argv = with_overrides(recipe_argv(work, name, num_rollout), extra)
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "train.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{name}: train.py exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    records = read_metrics(work / "outputs" / name / METRICS_FILE)
    return [r["time/step"] for r in records[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        action="append",
        metavar="NAME=FLAGS",
        help="a configuration: its name and the train.py flags it changes (repeatable)",
    )
    parser.add_argument("--num-rollout", type=int, default=20, help="steps per configuration")
    options = parser.parse_args()
    configs = [c.partition("=")[::2] for c in options.config or DEFAULT_CONFIGS]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny.build(work / "models" / "tiny-qwen3", work / "data" / "tiny-task", seed=0)
        results = {
            name: run(work, name, shlex.split(flags), options.num_rollout)
            for name, flags in configs
        }
    baseline = statistics.median(next(iter(results.values())))
    print(f"{'config':<12} {'steps':>5} {'median s':>9} {'min s':>7} {'max s':>7} {'ratio':>6}")
    for name, times in results.items():
        median = statistics.median(times)
        print(
            f"{name:<12} {len(times):>5} {median:>9.3f} {min(times):>7.3f} {max(times):>7.3f} "
            f"{median / baseline:>6.2f}"
        )


if __name__ == "__main__":
    main()
