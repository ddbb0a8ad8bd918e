"""``python3 train.py <argv>``: parse, check inputs, run the GRPO loop on Ray, summarise.

Everything that can be wrong with the input (argv, the model directory and its tokenizer and
chat template, the prompt files, the ``--load`` checkpoint, the output directories) is checked
before Ray starts (`check_inputs`): one line on stderr, exit 2, nothing started.
Launched by ``ray job submit`` (``RAY_ADDRESS`` set) the job joins that cluster; run directly it
starts a private local Ray instance for its own lifetime.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer import job_env
from trainer.arguments import PROG, UsageError, parse_args_or_exit, resolved_config

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        job_env.load()  # the job's secrets, before the arguments read WANDB_API_KEY
    except job_env.JobEnvError as err:
        return _fail(err, EXIT_ENVIRONMENT)
    args = parse_args_or_exit(argv)
    if args.validate_only:
        print(json.dumps(resolved_config(args), indent=2, sort_keys=True, default=str))
        return 0
    from trainer.checkpoint import CheckpointError
    from trainer.placement import PlacementError
    from trainer.preflight import PreflightError

    try:
        return run(args)
    except (UsageError, CheckpointError) as err:
        return _fail(err, EXIT_USAGE)
    except (PreflightError, PlacementError) as err:
        return _fail(err, EXIT_ENVIRONMENT)


def _fail(err: Exception, code: int) -> int:
    print(f"train.py: error: {err}", file=sys.stderr, flush=True)
    return code


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"--hf-checkpoint {path}: no usable tokenizer ({first})") from None


def check_chat_template(tokenizer: Any, args: argparse.Namespace) -> None:
    """The tokenizer's chat template renders a one-message conversation."""
    from jinja2 import TemplateError

    where = f"--hf-checkpoint {args.hf_checkpoint}"
    if getattr(tokenizer, "chat_template", None) is None:
        raise UsageError(f"{where} has no chat template; drop --apply-chat-template")
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "1 + 1 = ?"}],
            add_generation_prompt=True,
            tokenize=False,
            **args.apply_chat_template_kwargs,
        )
    except TemplateError as err:
        line = getattr(err, "lineno", None)
        detail = f"line {line}: {err.message}" if line else str(err.message)
        raise UsageError(f"{where}: its chat template fails ({detail})") from None


def check_inputs(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """Check everything the run reads and writes, before Ray starts; returns the tokenizer,
    the rollout source and the eval sets. Raises `UsageError` or `CheckpointError`."""
    from trainer import checkpoint, file_checks
    from trainer.data import eval_sets_from_args, rollout_source_from_args
    from trainer.metrics import METRICS_FILE, torn_tail

    model = Path(args.hf_checkpoint)
    if not model.is_dir():
        raise UsageError(f"--hf-checkpoint {model}: not a directory")
    if problem := file_checks.first_problem(p for p in model.iterdir() if p.is_file()):
        raise UsageError(f"--hf-checkpoint: {problem}")
    tokenizer = load_tokenizer(args.hf_checkpoint)
    if args.apply_chat_template:
        check_chat_template(tokenizer, args)
    source = rollout_source_from_args(args, tokenizer)
    eval_sets = eval_sets_from_args(args, tokenizer)
    load = Path(args.load) if args.load else None
    resumes = checkpoint.latest_iteration(load)
    if load is not None and resumes is not None:
        checkpoint.verify(load, resumes)
    for flag, value in (("--output-dir", args.output_dir), ("--save", args.save)):
        if value and (problem := file_checks.writable_dir_problem(Path(value))):
            raise UsageError(f"{flag} {value}: {problem}")
    if resumes is not None and (note := torn_tail(Path(args.output_dir) / METRICS_FILE)):
        print(f"{PROG}: {note}", flush=True)
    return tokenizer, source, eval_sets


def run(args: argparse.Namespace) -> int:
    started = time.time()
    from trainer import preflight

    tokenizer, source, eval_sets = check_inputs(args)
    preflight.run(args)

    import ray

    from trainer import placement
    from trainer.loop import GRPOLoop, num_rollouts
    from trainer.metrics import (
        METRICS_FILE,
        MetricsLogger,
        read_metrics,
        summarize,
        summary_text,
        write_summary,
    )

    output_dir = Path(args.output_dir)
    num_rollout = num_rollouts(args, len(source))
    updates = args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    layout = _init_ray(args)
    try:
        print(
            f"train.py: {num_rollout} rollouts x {args.rollout_batch_size} prompts x "
            f"{args.n_samples_per_prompt} samples on {layout.device}: "
            f"{len(layout.train_bundles)} training rank(s), {len(layout.engine_bundles)} "
            f"{args.rollout_backend} engine(s){', colocated' if args.colocate else ''}",
            flush=True,
        )
        cluster = placement.launch(args, layout, total_steps=num_rollout * updates)
        try:
            loop = GRPOLoop(
                args,
                trainers=cluster.trainers,
                engines=cluster.engines,
                tokenizer=tokenizer,
                source=source,
                eval_sets=eval_sets,
                logger_factory=lambda start, total: MetricsLogger(
                    output_dir, total_steps=total, start_step=start, args=args
                ),
                colocation=cluster.colocation,
            )
            loop.restore()
            adapter = loop.run()
        finally:
            cluster.shutdown()
    finally:
        ray.shutdown()
    summary = summarize(
        read_metrics(output_dir / METRICS_FILE), elapsed_s=time.time() - started, adapter=adapter
    )
    write_summary(output_dir, summary)
    print(summary_text(summary), flush=True)
    return 0


def _init_ray(args: argparse.Namespace) -> Any:
    """Join the job's cluster (``RAY_ADDRESS``) or start a private one; returns the layout."""
    import ray

    from trainer import placement
    from trainer.arguments import resolve_device

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", logging_level=logging.WARNING)
        device = placement.resolve_device(args, ray.cluster_resources())
        return placement.plan_layout(args, device)
    layout = placement.plan_layout(args, resolve_device(args))
    cpus = max(os.cpu_count() or 1, int(layout.needs()["CPU"]))
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    return layout
