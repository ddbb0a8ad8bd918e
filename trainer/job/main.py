"""``python3 train.py <argv>``: parse, check inputs, run the GRPO loop on Ray, summarise.

Everything that can be wrong with the input (argv, what the backends need of this Python's
packages, the model directory and its tokenizer and chat template, the LoRA targets against the
model, the prompt files and their lengths against the model's context, the ``--load``
checkpoint against this run, the output directories and who may change them) is checked before
Ray starts (`check_inputs`): one line on stderr, exit 2, nothing started or created. A
checkpoint that cannot be written later (a full disk) is one line and exit 1.
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
    from trainer.job.placement import PlacementError
    from trainer.job.preflight import PreflightError
    from trainer.run.checkpoint import CheckpointError, SaveError

    try:
        return run(config)
    except (UsageError, CheckpointError) as err:
        return _fail(err, EXIT_USAGE)
    except (PreflightError, PlacementError, SaveError) as err:
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
    """Check everything the run reads and writes, then what this Python offers its backends
    (`trainer.job.capabilities`: one line each), before Ray starts; returns the tokenizer, the
    rollout source and the eval sets. Raises `UsageError` or `CheckpointError`.

    Nothing is created or changed: the output directories are made when the run starts. A
    resume from another checkpoint than ``latest`` names, or a torn last metrics line, is
    noted on stdout."""
    from trainer.backends import registry
    from trainer.job import capabilities
    from trainer.run import checkpoint, file_checks
    from trainer.run.data import eval_sets, rollout_source
    from trainer.run.metrics import METRICS_FILE, torn_tail

    paths = config.checkpoint
    model = Path(paths.hf_checkpoint)
    if not model.is_dir():
        raise UsageError(f"--hf-checkpoint {model}: not a directory")
    if problem := file_checks.first_problem(p for p in model.iterdir() if p.is_file()):
        raise UsageError(f"--hf-checkpoint: {problem}")
    tokenizer = load_tokenizer(paths.hf_checkpoint)
    for spec in registry.selected(config):
        if spec.input_check and (problem := spec.input_check(config)):
            raise UsageError(problem)
    if config.data.apply_chat_template:
        check_chat_template(tokenizer, paths.hf_checkpoint, config.data)
    source = rollout_source(config, tokenizer)
    evals = eval_sets(config, tokenizer)
    check_context(config, tokenizer, source.samples, evals)
    check_directories(config)
    load = Path(paths.load) if paths.load else None
    resume = checkpoint.resume_point(load)
    if load is not None and resume is not None:
        from trainer.run import resume_checks

        if resume.note:
            print(f"{PROG}: {resume.note}", flush=True)
        saved = checkpoint.iter_dir(load, resume.iteration)
        # the run's own checks of the checkpoint's files, then what its backend needs
        problem = resume_checks.problem(config, load, resume.iteration, source)
        if problem := problem or registry.resume_problem(config, saved):
            raise checkpoint.CheckpointError(problem)
        if note := torn_tail(Path(paths.output_dir) / METRICS_FILE):
            print(f"{PROG}: {note}", flush=True)
    capabilities.check(config)
    return tokenizer, source, evals


def check_directories(config: TrainConfig) -> None:
    """``--output-dir`` and ``--save`` can be made and written, and they, ``--load`` and
    every directory above them only this user (and root) can change
    (`owned_files.check_dir`): another user could plant a symlink where the run writes, or a
    checkpoint where it reads. Makes nothing."""
    from common import owned_files
    from trainer.run import file_checks

    paths = config.checkpoint
    for flag, value, written in (
        ("--output-dir", paths.output_dir, True),
        ("--save", paths.save, True),
        ("--load", paths.load, False),
    ):
        if not value:
            continue
        try:
            owned_files.check_dir(value)
        except owned_files.NotPrivate as err:
            raise UsageError(f"{flag} {value}: {err}") from None
        if written and (problem := file_checks.writable_dir_problem(Path(value))):
            raise UsageError(f"{flag} {value}: {problem}")


def check_context(
    config: TrainConfig, tokenizer: Any, prompts: Sequence[Any], evals: dict[str, Any]
) -> None:
    """Every prompt the run keeps fits the model's context with its response window
    (`trainer.run.context_length`)."""
    from trainer.run import context_length

    limit = context_length.model_context(Path(config.checkpoint.hf_checkpoint))
    if limit is None:
        return
    sets = [
        ("--prompt-data " + config.data.prompt_data, prompts, "--rollout-max-response-len",
         config.rollout.rollout_max_response_len),
        *((f"--eval-prompt-data {name}", samples, "--eval-max-response-len",
           config.eval.eval_max_response_len) for name, samples in evals.items()),
    ]  # fmt: skip
    for where, samples, flag, response_len in sets:
        if problem := context_length.overlong_problem(
            samples,
            tokenizer,
            response_len=response_len,
            limit=limit,
            where=where,
            response_flag=flag,
        ):
            raise UsageError(problem)


def _colocation_note(placement: PlacementConfig) -> str:
    if not placement.colocate:
        return ""
    return ", colocated" if placement.swaps_memory else ", colocated, both resident (no swaps)"


def run(config: TrainConfig) -> int:
    started = time.time()
    from trainer.job import colocate_memory, preflight

    tokenizer, source, eval_sets = check_inputs(config)
    shape = colocate_memory.model_shape_for(config)
    preflight.run(config.placement)

    import ray

    layout = _init_ray(config.placement)
    try:
        config, adapter = _train(config, layout, shape, tokenizer, source, eval_sets)
    finally:
        ray.shutdown()
    _summarize(config, layout.device, adapter, elapsed_s=time.time() - started)
    return 0


def _train(
    config: TrainConfig,
    layout: Any,
    shape: Any,
    tokenizer: Any,
    source: Any,
    eval_sets: dict[str, Any],
) -> tuple[TrainConfig, Path | None]:
    """Place the trainers and engines on the job's cluster (`layout`), with the memory plan
    resolved for its device, and run the GRPO loop; the config as resolved and the adapter
    saved last."""
    from trainer.job import colocate_memory, placement
    from trainer.loop import GRPOLoop
    from trainer.run.data import num_rollouts
    from trainer.run.metrics import MetricsLogger

    output_dir = Path(config.checkpoint.output_dir)
    rollout = config.rollout
    num_rollout = num_rollouts(rollout, len(source))
    updates = rollout.samples // config.batch.global_batch_size
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
        f"{config.placement.rollout_backend} engine(s){_colocation_note(config.placement)}",
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
        return config, loop.run()
    finally:
        cluster.shutdown()


def _summarize(config: TrainConfig, device: str, adapter: Path | None, *, elapsed_s: float) -> None:
    """The end-of-run summary: written beside the metrics and printed."""
    from trainer.run.metrics import (
        METRICS_FILE,
        read_metrics,
        summarize,
        summary_text,
        write_summary,
    )

    output_dir = Path(config.checkpoint.output_dir)
    summary = summarize(
        read_metrics(output_dir / METRICS_FILE),
        elapsed_s=elapsed_s,
        adapter=adapter,
        merged_in=config.placement.resolve_dtype(device) if config.lora.merged else None,
    )
    write_summary(output_dir, summary)
    print(summary_text(summary), flush=True)


def _init_ray(flags: PlacementConfig) -> Any:
    """Join the job's cluster (``RAY_ADDRESS``) or start a private one; returns the layout."""
    import ray

    from trainer.job import placement

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto", logging_level=logging.WARNING)
        device = placement.resolve_device(flags, ray.cluster_resources())
        return placement.plan_layout(flags, device)
    layout = placement.plan_layout(flags, flags.resolve_device())
    cpus = max(os.cpu_count() or 1, int(layout.needs()["CPU"]))
    ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    return layout
