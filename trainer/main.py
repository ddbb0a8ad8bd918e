"""``python3 train.py <argv>``: parse, check inputs, run the GRPO loop on Ray, summarise.

Everything that can be wrong with the input (argv, the model directory and its tokenizer and
chat template, the LoRA targets against the model, the prompt files, the ``--load`` checkpoint,
the output directories) is checked
before Ray starts (`check_inputs`): one line on stderr, exit 2, nothing started.
Launched by ``ray job submit`` (``RAY_ADDRESS`` set) the job joins that cluster; run directly it
starts a private local Ray instance for its own lifetime.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer import job_env
from trainer.arguments import PROG, parse_args_or_exit
from trainer.config import DataConfig, PlacementConfig, TrainConfig
from trainer.errors import UsageError, first_line

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        job_env.load()  # the job's secrets, before the arguments read WANDB_API_KEY
    except job_env.JobEnvError as err:
        return _fail(err, EXIT_ENVIRONMENT)
    config = parse_args_or_exit(argv)
    if config.misc.validate_only:
        print(json.dumps(config.as_dict(), indent=2, sort_keys=True, default=str))
        return 0
    from trainer.checkpoint import CheckpointError
    from trainer.placement import PlacementError
    from trainer.preflight import PreflightError

    try:
        return run(config)
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
        raise UsageError(
            f"--hf-checkpoint {path}: no usable tokenizer ({first_line(err)})"
        ) from None


def check_chat_template(tokenizer: Any, model: str, data: DataConfig) -> None:
    """The tokenizer's chat template renders a one-message conversation."""
    from jinja2 import TemplateError

    where = f"--hf-checkpoint {model}"
    if getattr(tokenizer, "chat_template", None) is None:
        raise UsageError(f"{where} has no chat template; drop --apply-chat-template")
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "1 + 1 = ?"}],
            add_generation_prompt=True,
            tokenize=False,
            **data.apply_chat_template_kwargs,
        )
    except TemplateError as err:
        line = getattr(err, "lineno", None)
        detail = f"line {line}: {err.message}" if line else str(err.message)
        raise UsageError(f"{where}: its chat template fails ({detail})") from None


def check_inputs(config: TrainConfig) -> tuple[Any, Any, dict[str, Any]]:
    """Check everything the run reads and writes, before Ray starts; returns the tokenizer,
    the rollout source and the eval sets. Raises `UsageError` or `CheckpointError`."""
    from trainer import checkpoint, file_checks
    from trainer.backends import registry
    from trainer.data import eval_sets, rollout_source
    from trainer.metrics import METRICS_FILE, torn_tail

    paths, data = config.checkpoint, config.data
    model = Path(paths.hf_checkpoint)
    if not model.is_dir():
        raise UsageError(f"--hf-checkpoint {model}: not a directory")
    if problem := file_checks.first_problem(p for p in model.iterdir() if p.is_file()):
        raise UsageError(f"--hf-checkpoint: {problem}")
    tokenizer = load_tokenizer(paths.hf_checkpoint)
    for spec in registry.selected(config):
        if spec.input_check and (problem := spec.input_check(config)):
            raise UsageError(problem)
    if data.apply_chat_template:
        check_chat_template(tokenizer, paths.hf_checkpoint, data)
    source = rollout_source(config, tokenizer)
    evals = eval_sets(config, tokenizer)
    load = Path(paths.load) if paths.load else None
    resumes = checkpoint.latest_iteration(load)
    if load is not None and resumes is not None:
        checkpoint.verify(load, resumes)
        lora = config.lora
        if problem := checkpoint.adapter_shape_problem(
            load, resumes, lora.lora_rank, lora.lora_alpha
        ):
            raise UsageError(problem)
    for flag, value in (("--output-dir", paths.output_dir), ("--save", paths.save)):
        if value and (problem := file_checks.writable_dir_problem(Path(value))):
            raise UsageError(f"{flag} {value}: {problem}")
    if resumes is not None and (note := torn_tail(Path(paths.output_dir) / METRICS_FILE)):
        print(f"{PROG}: {note}", flush=True)
    return tokenizer, source, evals


def _colocation_note(placement: PlacementConfig) -> str:
    if not placement.colocate:
        return ""
    return ", colocated" if placement.swaps_memory else ", colocated, both resident (no swaps)"


def run(config: TrainConfig) -> int:
    started = time.time()
    from trainer import colocate_memory, preflight

    tokenizer, source, eval_sets = check_inputs(config)
    shape = colocate_memory.model_shape_for(config)
    preflight.run(config.placement)

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

    output_dir = Path(config.checkpoint.output_dir)
    rollout = config.rollout
    num_rollout = num_rollouts(rollout, len(source))
    updates = rollout.samples // config.batch.global_batch_size
    layout = _init_ray(config.placement)
    try:
        train_python = config.placement.train_python
        config = colocate_memory.resolve(
            config,
            shape,
            device=layout.device,
            device_memory=lambda: placement.device_memory(train_python),
        )
        print(
            f"train.py: {num_rollout} rollouts x {rollout.rollout_batch_size} prompts x "
            f"{rollout.n_samples_per_prompt} samples on {layout.device}: "
            f"{len(layout.train_bundles)} training rank(s), {len(layout.engine_bundles)} "
            f"{config.placement.rollout_backend} engine(s)"
            f"{_colocation_note(config.placement)}",
            flush=True,
        )
        cluster = placement.launch(config, layout, total_steps=num_rollout * updates)
        try:
            loop = GRPOLoop(
                config,
                trainers=cluster.trainers,
                engines=cluster.engines,
                tokenizer=tokenizer,
                source=source,
                eval_sets=eval_sets,
                logger_factory=lambda start, total: MetricsLogger(
                    output_dir, total_steps=total, start_step=start, config=config
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
        read_metrics(output_dir / METRICS_FILE),
        elapsed_s=time.time() - started,
        adapter=adapter,
        merged_in=config.placement.resolve_dtype(layout.device) if config.lora.merged else None,
    )
    write_summary(output_dir, summary)
    print(summary_text(summary), flush=True)
    return 0


def _init_ray(flags: PlacementConfig) -> Any:
    """Join the job's cluster (``RAY_ADDRESS``) or start a private one; returns the layout."""
    import ray

    from trainer import placement

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", logging_level=logging.WARNING)
        device = placement.resolve_device(flags, ray.cluster_resources())
        return placement.plan_layout(flags, device)
    layout = placement.plan_layout(flags, flags.resolve_device())
    cpus = max(os.cpu_count() or 1, int(layout.needs()["CPU"]))
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    return layout
