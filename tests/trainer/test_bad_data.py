"""Bad data never reaches training silently: a reward that is not a finite number stops the run
before any optimizer step, prompts that do not fit the model's context stop it before Ray, and
the end-of-run summary never fails on a metric that was NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.trainer.test_loop import make_loop, recipe_argv, tiny_dirs  # noqa: F401  (fixture)
from trainer.arguments import parse_args
from trainer.errors import UsageError
from trainer.job.main import check_inputs
from trainer.run import checkpoint
from trainer.run.metrics import METRICS_FILE, read_metrics, summarize, summary_text

CALLS = {"n": 0}


def nan_from_the_second_rollout(args, sample) -> float:
    """A custom reward (miles' signature) that breaks after the first rollout's 16 samples."""
    CALLS["n"] += 1
    return math.nan if CALLS["n"] > 16 else 0.5


def test_a_nan_reward_stops_the_run_before_it_trains_or_saves(tiny_dirs, tmp_path):  # noqa: F811
    model, data = tiny_dirs
    CALLS["n"] = 0
    ckpt = tmp_path / "ckpt"
    argv = recipe_argv(
        model, data, tmp_path, "--num-rollout", "3", "--save", str(ckpt), "--save-interval", "1",
        "--custom-rm-path", "tests.trainer.test_bad_data.nan_from_the_second_rollout",
    )  # fmt: skip
    loop, trainers = make_loop(argv)
    with pytest.raises(UsageError) as raised:
        loop.run()
    assert str(raised.value) == (
        "--custom-rm-path tests.trainer.test_bad_data.nan_from_the_second_rollout returned nan for "
        f"a response to row {loop.source.samples[loop.source.order(0)[4]].index + 1} of "
        f"--prompt-data {data / 'train.jsonl'}: a reward must be a finite number (stopped "
        "before training on it)"
    )
    assert trainers.trainer.steps == 2  # the first rollout's two optimizer steps, no more
    assert checkpoint.resume_point(ckpt) == checkpoint.Resume(1)
    assert sorted(p.name for p in ckpt.iterdir()) == ["iter_0000001", "latest"]
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE)] == [0]


def test_the_summary_of_a_run_with_nan_metrics_is_written(tmp_path):
    """A NaN reward or eval score is null in metrics.jsonl (``_finite``); the summary once
    failed with a TypeError formatting it."""
    records = [
        {"step": 0, "rollout/reward_mean": 0.5, "eval/tiny": 0.25, "time/step": 1.0},
        {"step": 1, "rollout/reward_mean": None, "eval/tiny": None, "time/step": math.nan},
        {"step": 2, "rollout/reward_mean": math.inf, "eval/other": math.nan},
    ]
    summary = summarize(records, elapsed_s=3.0, adapter=None)
    assert summary["reward_first5"] == summary["reward_last5"] == 0.5
    assert summary["mean_step_s"] == 1.0
    assert summary["last_eval"] == {"eval/tiny": None, "eval/other": None}
    json.dumps(summary, allow_nan=False)
    text = summary_text(summary)
    assert "  eval/tiny           n/a" in text and "  eval/other          n/a" in text


def long_prompts(data: Path, path: Path, words: int, count: int = 2) -> Path:
    rows = [{"prompt": "say " + " ".join(["red"] * words), "label": "red"}] * count
    path.write_text(
        (data / "train.jsonl").read_text() + "".join(json.dumps(r) + "\n" for r in rows)
    )
    return path


def test_only_prompts_the_data_flags_keep_must_fit_the_context(tiny_dirs, tmp_path):  # noqa: F811
    """The tiny model's context is 512 tokens; a 606-token prompt (600 words and the chat
    template's 6) is refused, unless ``--rollout-max-prompt-len`` drops it first."""
    model, data = tiny_dirs
    prompts = long_prompts(data, tmp_path / "long.jsonl", 600)

    def config(*extra: str):
        argv = recipe_argv(model, data, tmp_path / "out", *extra)
        argv[argv.index("--prompt-data") + 1] = str(prompts)
        return parse_args(argv)

    with pytest.raises(UsageError, match="2 of 258 prompts do not fit the model's context"):
        check_inputs(config())
    _, source, _ = check_inputs(config("--rollout-max-prompt-len", "508"))
    assert len(source) == 256
    with pytest.raises(
        UsageError,
        match=r"256 of 256 prompts .* the longest is 7 tokens \+ --rollout-max-response-len 510",
    ):
        check_inputs(config("--rollout-max-prompt-len", "508", "--rollout-max-response-len", "510"))

    fits = long_prompts(data, tmp_path / "fits.jsonl", 500, count=1)  # 506 + 4 tokens
    evals = ["--eval-prompt-data", "long", str(prompts), "--eval-max-response-len", "4"]
    argv = recipe_argv(model, data, tmp_path / "out", *evals)
    argv[argv.index("--prompt-data") + 1] = str(fits)
    with pytest.raises(UsageError, match=r"^--eval-prompt-data long: 2 of 258 prompts"):
        check_inputs(parse_args(argv))
