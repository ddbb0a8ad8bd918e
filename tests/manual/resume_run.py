"""One run of the tiny recipe on one NVIDIA GPU in bf16, in this process and without Ray (the
portable backends: PEFT trainer, transformers engine), for `test_cuda_resume`.

    python -m tests.manual.resume_run MODEL DATA RUN_DIR [--stop-after N] [--device cpu]

With ``--stop-after N`` a fresh run stops (exit 3) when rollout N + 1 starts generating, as
an interrupted run would, its checkpoint of rollout N (N even) or the one before on disk; run
again without it, it resumes from there. Deterministic algorithms are asked for (with a warning
where an op has none); set ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment for cuBLAS.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROLLOUTS = 6
ROLLOUT_SAMPLES = 16  # 4 prompts x 4 samples
EXIT_STOPPED = 3


def recipe(model: Path, data: Path, run: Path, device: str) -> list[str]:
    save = run / "ckpt"
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "tiny",
        "--num-rollout", str(ROLLOUTS), "--rollout-batch-size", "4",
        "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4",
        "--global-batch-size", "8", "--micro-batch-size", "4", "--lr", "1e-2",
        "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--min-lr", "1e-3",
        "--lora-rank", "4", "--lora-alpha", "8",
        "--device", device, "--dtype", "bf16" if device == "cuda" else "fp32",
        "--eval-prompt-data", "tiny", str(data / "eval.jsonl"), "--eval-interval", "3",
        "--save", str(save), "--load", str(save), "--save-interval", "2",
        "--output-dir", str(run / "out"), "--seed", "0", "--check-adapter-sync",
    ]  # fmt: skip


class Stopped(Exception):
    """The interruption `--stop-after` asks for."""


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoTokenizer

    from tests.trainer.test_loop import LocalEngines, LocalTrainers
    from trainer.arguments import parse_args
    from trainer.backends.torch.rollout import create as create_engine
    from trainer.backends.torch.trainer import create as create_trainer
    from trainer.loop import GRPOLoop
    from trainer.run.data import eval_sets, rollout_source
    from trainer.run.metrics import MetricsLogger

    parser = argparse.ArgumentParser(prog="python -m tests.manual.resume_run")
    parser.add_argument("model", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("run", type=Path)
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--device", default="cuda", help="cpu: the same run in fp32")
    args = parser.parse_args(argv)

    torch.use_deterministic_algorithms(True, warn_only=True)
    config = parse_args(recipe(args.model, args.data, args.run, args.device))
    tokenizer = AutoTokenizer.from_pretrained(config.checkpoint.hf_checkpoint)
    source = rollout_source(config, tokenizer)
    trainers = LocalTrainers(create_trainer(config, args.device, total_steps=2 * ROLLOUTS))
    engines = LocalEngines(create_engine(config, args.device), trainers.calls)
    if args.stop_after is not None:
        generate, rollouts = engines.generate, []

        def generate_until_stopped(prompts, params):
            if len(prompts) == ROLLOUT_SAMPLES:  # a rollout's (an eval's are 32 x 1)
                rollouts.append(params.seed)
                if len(rollouts) > args.stop_after:
                    raise Stopped
            return generate(prompts, params)

        engines.generate = generate_until_stopped
    loop = GRPOLoop(
        config,
        trainers=trainers,
        engines=engines,
        tokenizer=tokenizer,
        source=source,
        eval_sets=eval_sets(config, tokenizer),
        logger_factory=lambda start, total: MetricsLogger(
            args.run / "out", total_steps=total, start_step=start, config=config
        ),
    )
    loop.restore()
    try:
        loop.run()
    except Stopped:
        print(f"stopped when rollout {args.stop_after + 1} started", flush=True)
        return EXIT_STOPPED
    return 0


if __name__ == "__main__":
    sys.exit(main())
