"""The GRPO loop without Ray: packing, scheduling, metrics, colocation, the train.py entry."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from trainer import tiny
from trainer.arguments import parse_args
from trainer.backends.base import Generation, adapter_digest
from trainer.backends.torch.rollout import create as create_engine
from trainer.backends.torch.trainer import create as create_trainer
from trainer.batching import pack, schedule
from trainer.loop import GRPOLoop, rollout_metrics
from trainer.run import adapter_check
from trainer.run.data import eval_sets, rollout_source
from trainer.run.metrics import (
    METRICS_FILE,
    MetricsLogger,
    console_line,
    read_metrics,
    summarize,
    summary_text,
)

ROOT = Path(__file__).resolve().parents[2]


class LocalTrainers:
    """A one-rank `TrainerGroup` in this process."""

    world_size = 1

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.calls: list[str] = []

    def forward(self, shards, *, with_adapter):
        return [[self.trainer.forward(b, with_adapter=with_adapter) for b in shards[0]]]

    def train_step(self, shards, loss_fn):
        return [self.trainer.train_step(shards[0], loss_fn)]

    def export_adapter(self):
        return self.trainer.export_adapter()

    def adapter_digests(self):
        return [adapter_digest(self.trainer.export_adapter())]

    def save(self, path):
        self.trainer.save(path)

    def load(self, path):
        self.trainer.load(path)

    def release_memory(self):
        self.calls.append("trainer.release")

    def resume_memory(self):
        self.calls.append("trainer.resume")


class LocalEngines:
    def __init__(self, engine, calls: list[str]) -> None:
        self.engine = engine
        self.calls = calls

    def generate(self, prompts, params):
        self.calls.append("engine.generate")
        return self.engine.generate(prompts, params)

    def load_adapter(self, adapter):
        self.calls.append(f"engine.load_adapter v{adapter.version}")
        self.engine.load_adapter(adapter)

    def score(self, token_ids):
        return self.engine.score(token_ids)

    def release_memory(self):
        self.calls.append("engine.release")

    def resume_weights(self):
        self.calls.append("engine.resume_weights")

    def resume_memory(self):
        self.calls.append("engine.resume")


class StaleEngines(LocalEngines):
    """An engine whose adapter updates never arrive (a broken sync)."""

    def load_adapter(self, adapter):
        self.calls.append(f"engine.load_adapter v{adapter.version} (dropped)")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=0)
    return root / "model", root / "data"


def recipe_argv(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "tiny",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "4", "--global-batch-size", "8", "--micro-batch-size", "4",
        "--lr", "1e-2", "--lora-rank", "4", "--lora-alpha", "8", "--device", "cpu",
        "--output-dir", str(out), "--seed", "0", *extra,
    ]  # fmt: skip


def make_loop(argv: Sequence[str], engines=LocalEngines) -> tuple[GRPOLoop, LocalTrainers]:
    from transformers import AutoTokenizer

    args = parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint.hf_checkpoint)
    source = rollout_source(args, tokenizer)
    total = (args.rollout.num_rollout or 1) * 2
    trainers = LocalTrainers(create_trainer(args, "cpu", total_steps=total))
    engines = engines(create_engine(args, "cpu"), trainers.calls)
    loop = GRPOLoop(
        args,
        trainers=trainers,
        engines=engines,
        tokenizer=tokenizer,
        source=source,
        eval_sets=eval_sets(args, tokenizer),
        logger_factory=lambda start, steps: MetricsLogger(
            Path(args.checkpoint.output_dir), total_steps=steps, start_step=start, config=args
        ),
    )
    return loop, trainers


def generation(prompt: Sequence[int], response: Sequence[int], truncated=False) -> Generation:
    return Generation(
        tuple(prompt), tuple(response), tuple(-0.1 * (i + 1) for i in range(len(response))),
        truncated,
    )  # fmt: skip


def test_pack_aligns_response_tokens_with_the_shifted_sequence():
    batch = pack([generation([5, 6, 7], [8, 9]), generation([5], [8, 9, 2])], [1.5, -1.0], 0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 8, 9, 2, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # entry t predicts token t + 1: the response tokens of row 0 sit at 3 and 4 -> entries 2, 3
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert batch.rollout_logprobs[0, 2:].tolist() == pytest.approx([-0.1, -0.2])
    assert batch.rollout_logprobs[1, :3].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert batch.advantages.tolist() == [[0, 0, 1.5, 1.5], [-1, -1, -1, 0]]


def test_pack_drops_truncated_responses_from_the_loss_when_asked():
    gens = [generation([5], [8, 9], truncated=True), generation([5], [8, 2])]
    assert pack(gens, [1.0, 1.0], 0).loss_mask.tolist() == [[1, 1], [1, 1]]
    assert pack(gens, [1.0, 1.0], 0, drop_truncated=True).loss_mask.tolist() == [[0, 0], [1, 1]]


def test_schedule_splits_steps_ranks_and_micro_batches():
    plan = schedule([3] * 8, global_batch=4, world_size=2, micro_batch=1)
    assert plan == [[[[0], [1]], [[2], [3]]], [[[4], [5]], [[6], [7]]]]
    balanced = schedule([9, 1, 8, 2], global_batch=4, world_size=2, micro_batch=2, balance=True)
    tokens = [sum([9, 1, 8, 2][i] for mb in rank for i in mb) for rank in balanced[0]]
    assert sorted(i for rank in balanced[0] for mb in rank for i in mb) == [0, 1, 2, 3]
    assert tokens == [10, 10]


def test_micro_batches_are_length_bucketed():
    lengths = [5, 100, 6, 99, 50, 7]
    [[rank]] = schedule(lengths, global_batch=6, world_size=1, micro_batch=2)
    assert rank == [[1, 3], [4, 5], [2, 0]]
    padded = sum(len(mb) * max(lengths[i] for i in mb) for mb in rank)
    assert padded == 2 * 100 + 2 * 50 + 2 * 6  # contiguous pairs would pad to 2 x (100+99+50)
    # one sample per micro-batch: nothing to pad, order kept
    assert schedule(lengths, global_batch=6, world_size=1, micro_batch=1)[0][0] == [
        [i] for i in range(6)
    ]


class CountingTrainers(LocalTrainers):
    def __init__(self, trainer) -> None:
        super().__init__(trainer)
        self.reference_forwards = self.policy_forwards = 0

    def forward(self, shards, *, with_adapter):
        self.reference_forwards += not with_adapter
        self.policy_forwards += with_adapter
        return super().forward(shards, with_adapter=with_adapter)


def train_once(tiny_dirs, tmp_path, *extra: str):
    """One rollout's optimizer steps from a fresh trainer: (metrics, gradients, trainers)."""
    from trainer.loop import Timer

    model, data = tiny_dirs
    loop, trainers = make_loop(recipe_argv(model, data, tmp_path, *extra))
    trainers = CountingTrainers(trainers.trainer)
    loop.trainers = trainers
    samples = loop.source.next_batch(loop.config.rollout.rollout_batch_size)
    generations = loop.generate(samples, 0, evaluation=False)
    advantages = torch.linspace(-1.0, 1.0, len(generations))
    metrics = loop.train(generations, advantages, Timer())
    grads = [p.grad.clone() for p in trainers.trainer.params]
    return metrics, grads, trainers


def test_reference_forward_runs_only_for_the_kl_loss(tiny_dirs, tmp_path):
    """Without --use-kl-loss no adapter-disabled forward runs, and the steps are those taken
    with it at --kl-loss-coef 0 (the KL then only a metric)."""
    plain, plain_grads, plain_trainers = train_once(tiny_dirs, tmp_path / "a")
    kl, kl_grads, kl_trainers = train_once(
        tiny_dirs, tmp_path / "b", "--use-kl-loss", "--kl-loss-coef", "0"
    )
    assert plain_trainers.reference_forwards == 0 and kl_trainers.reference_forwards == 1
    assert "train/kl" not in plain and "train/kl" in kl
    for key in ("train/pg_loss", "train/grad_norm", "train/entropy", "train/ppo_ratio"):
        assert plain[key] == kl[key], key
    for a, b in zip(plain_grads, kl_grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("global_batch", "forwards"), [("16", 0), ("8", 1)])
def test_old_logprobs_forward_runs_only_for_several_steps_per_rollout(
    tiny_dirs, tmp_path, global_batch, forwards
):
    """With one optimizer step per rollout the old policy is the trained one (its log-probs come
    from the training forward); with two, the second step needs the first's old policy."""
    metrics, _, trainers = train_once(tiny_dirs, tmp_path, "--global-batch-size", global_batch)
    assert trainers.policy_forwards == forwards
    assert 0 <= metrics["train/train_rollout_logprob_abs_diff"] < 1e-4
    if forwards == 0:
        assert metrics["train/ppo_ratio"] == 1.0 and metrics["train/pg_clipfrac"] == 0.0


def test_bucketing_keeps_the_steps(tiny_dirs, tmp_path, monkeypatch):
    """Length-bucketed micro-batches take the steps contiguous micro-batches take."""
    import trainer.batching

    bucketed, bucketed_grads, _ = train_once(tiny_dirs, tmp_path / "a")
    monkeypatch.setattr(
        trainer.batching,
        "bucketed",
        lambda indices, lengths, size: [
            indices[i : i + size] for i in range(0, len(indices), size)
        ],
    )
    contiguous, contiguous_grads, _ = train_once(tiny_dirs, tmp_path / "b")
    for key in ("train/pg_loss", "train/grad_norm", "train/entropy"):
        assert bucketed[key] == pytest.approx(contiguous[key], rel=1e-5, abs=1e-7), key
    for a, b in zip(bucketed_grads, contiguous_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_rollout_metrics():
    gens = [generation([1], [2]), generation([1], [3, 4, 5], True)] * 2
    metrics = rollout_metrics(gens, torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2)
    assert metrics["rollout/reward_mean"] == 0.75
    assert metrics["rollout/response_len_mean"] == 2.0
    assert metrics["rollout/truncated_ratio"] == 0.5
    assert metrics["rollout/zero_std_group_ratio"] == 0.5


def test_loop_runs_logs_and_takes_turns_on_the_devices(tiny_dirs, tmp_path, capsys):
    model, data = tiny_dirs
    argv = recipe_argv(
        model, data, tmp_path, "--num-rollout", "2", "--colocate", "--eval-interval", "1",
        "--eval-prompt-data", "tiny", str(data / "eval.jsonl"), "--use-wandb",
        "--wandb-mode", "disabled",
    )  # fmt: skip
    loop, trainers = make_loop(argv)
    adapter = loop.run()
    assert adapter == tmp_path / "final" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()

    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        for key in (
            "rollout/reward_mean", "rollout/reward_std", "rollout/response_len_mean",
            "rollout/truncated_ratio", "train/pg_clipfrac", "train/entropy",
            "train/train_rollout_logprob_abs_diff", "train/grad_norm", "train/lr",
            "time/rollout", "time/train", "time/logprobs", "time/step", "eval/tiny",
        ):  # fmt: skip
            assert key in record, key
        assert record["train/train_rollout_logprob_abs_diff"] < 1e-4
    assert "step 2/2 | reward" in capsys.readouterr().out

    # 2 optimizer steps per rollout (16 samples, global batch 8); each rollout phase first loads
    # the newest adapter, with the engine's weights back and its KV cache not yet; the trainer
    # gives the devices up around every rollout phase.
    release, weights, resume = ["trainer.release"], ["engine.resume_weights"], ["engine.resume"]
    back = ["engine.release", "trainer.resume"]
    assert trainers.calls == [
        "engine.release",
        *release, *weights, *resume, "engine.generate", *back,
        *release, *weights, "engine.load_adapter v2", *resume, "engine.generate", *back,
        *release, *weights, *resume, "engine.generate", *back,
        *release, *weights, "engine.load_adapter v4", *resume, "engine.generate", *back,
    ]  # fmt: skip


def test_each_timed_phase_of_a_step_is_entered_in_the_loops_observer(tiny_dirs, tmp_path):
    """What a benchmark's memory sampler sees: every phase the step's metrics time, entered
    and left as it runs, inner phases within the step."""
    model, data = tiny_dirs
    argv = recipe_argv(model, data, tmp_path, "--num-rollout", "1", "--colocate")
    loop, _ = make_loop(argv)
    events: list[tuple[str, str]] = []

    @contextmanager
    def observe(name: str) -> Iterator[None]:
        events.append(("enter", name))
        yield
        events.append(("leave", name))

    loop.observe_phase = observe
    loop.run()
    entered = [name for event, name in events if event == "enter"]
    assert events[0] == ("enter", "step") and events[-1] == ("leave", "step")
    assert {"rollout", "reward", "logprobs", "train", "export_adapter"} <= set(entered)
    assert sorted(entered) == sorted(name for event, name in events if event == "leave")
    records = read_metrics(tmp_path / METRICS_FILE)
    assert {f"time/{name}" for name in entered} == {k for k in records[0] if k.startswith("time/")}


def test_colocated_with_memory_kept_the_loop_makes_no_swaps(tiny_dirs, tmp_path):
    model, data = tiny_dirs
    argv = recipe_argv(
        model, data, tmp_path, "--num-rollout", "2", "--colocate", "--colocate-memory", "keep"
    )
    loop, trainers = make_loop(argv)
    loop.run()
    assert trainers.calls == ["engine.generate", "engine.load_adapter v2", "engine.generate"]


@pytest.mark.parametrize(
    ("engines", "serving", "synced"),
    [
        (LocalEngines, "adapter", True),
        (LocalEngines, "merged", True),  # the adapter folded into the engine's weights
        (StaleEngines, "adapter", False),
    ],
)
def test_adapter_sync_check_compares_engine_and_trainer(
    tiny_dirs, tmp_path, engines, serving, synced
):
    """The engines' log-probs of a fixed sequence match the trainer's after each update, and
    the check fails when the adapter never reaches the engine."""
    model, data = tiny_dirs
    argv = recipe_argv(
        model, data, tmp_path, "--num-rollout", "4", "--check-adapter-sync",
        "--lora-serving", serving,
    )  # fmt: skip
    loop, _ = make_loop(argv, engines)
    loop.run()
    records = read_metrics(tmp_path / METRICS_FILE)
    assert "sync/engine_trainer_logprob_abs_diff" not in records[0]  # nothing published yet
    # Rollout r checks the adapter of update r - 1, whose shift from the base policy is known.
    pairs = [
        (after["sync/engine_trainer_logprob_abs_diff"], before["sync/adapter_shift"])
        for before, after in itertools.pairwise(records)
    ]
    assert any(shift > 1e-3 for _, shift in pairs)  # the adapter moved: a stale one shows
    for diff, shift in pairs:
        assert diff < 1e-5 if synced else (diff > 1e-3) == (shift > 1e-3), (diff, shift)
    assert all(r["sync/ranks_off_rank0_adapter"] == 0 for r in records)

    # The saved adapter carries the trainer's log-probs of the sequence; PEFT reproduces them.
    check = adapter_check.read(loop.saved)
    peft, without = adapter_check.peft_logprobs(loop.saved, check)
    assert len(peft) == len(check.logprobs) > 0
    assert adapter_check.mean_abs_diff(peft, check.logprobs) < 1e-4
    assert adapter_check.mean_abs_diff(without, check.logprobs) > 1e-3


@pytest.mark.parametrize("serving", ["adapter", "merged"])
def test_in_bf16_the_engine_serves_the_policy_the_trainer_trains(tiny_dirs, tmp_path, serving):
    """At a small learning rate most of an update is below the rounding step of the bf16
    weights it is merged into; with ``--lora-serving merged`` the trainer computes through the
    same rounded weights (`merged_policy`), so the engine still serves exactly the policy being
    trained, as it does serving the adapter."""
    model, data = tiny_dirs
    argv = recipe_argv(
        model, data, tmp_path, "--num-rollout", "3", "--check-adapter-sync", "--dtype", "bf16",
        "--lr", "1e-4", "--lora-serving", serving,
    )  # fmt: skip
    loop, _ = make_loop(argv)
    loop.run()
    records = read_metrics(tmp_path / METRICS_FILE)
    shifts = []
    for before, after in itertools.pairwise(records):
        lag, shift = after["sync/engine_trainer_logprob_abs_diff"], before["sync/adapter_shift"]
        assert lag < 1e-6, (lag, shift)
        shifts.append(shift)
    assert max(shifts) > 1e-3  # the updates moved the policy


def test_metrics_logger_drops_steps_a_resumed_run_repeats(tmp_path):
    first = MetricsLogger(tmp_path, total_steps=4)
    for step in range(3):
        first.log(step, {"rollout/reward_mean": step / 10})
    resumed = MetricsLogger(tmp_path, total_steps=4, start_step=2)
    resumed.log(2, {"rollout/reward_mean": 0.5})
    resumed.log(3, {"rollout/reward_mean": float("nan")})
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert records[2]["rollout/reward_mean"] == 0.5 and records[3]["rollout/reward_mean"] is None


def test_console_line_and_summary():
    line = console_line(4, 10, {"rollout/reward_mean": 0.25, "train/kl": 0.001, "eval/x": 0.5})
    assert line == "step 5/10 | reward 0.250 | kl 1.00e-03 | eval/x 0.500"
    records = [{"step": i, "rollout/reward_mean": r} for i, r in enumerate([0, 0.1, 0.1, 0.2] * 3)]
    summary = summarize(records, elapsed_s=3.0, adapter=None)
    assert summary["steps"] == 12
    assert summary["reward_first5"] == pytest.approx(0.08)
    assert summary["reward_last5"] == pytest.approx(0.12)
    assert "policy" not in summary_text(summary)
    merged = summarize(records, elapsed_s=3.0, adapter=Path("a"), merged_in="bf16")
    assert "  policy              the adapter merged into the base in bf16" in summary_text(merged)


def test_wandb_logs_offline_into_the_output_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    args = parse_args(
        ["--hf-checkpoint", "m", "--prompt-data", "p.jsonl", "--use-wandb",
         "--wandb-project", "tiny-test", "--output-dir", str(tmp_path)]
    )  # fmt: skip
    assert args.wandb.wandb_mode == "offline"
    logger = MetricsLogger(tmp_path, total_steps=1, config=args)
    logger.log(0, {"rollout/reward_mean": 0.5})
    logger.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    assert runs[0].name.endswith((tmp_path / "wandb_run_id").read_text())


def run_train_py(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train.py", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-rank", "0"], "--lora-rank must be > 0"),
        (["--no-such-flag", "1"], "unrecognized argument --no-such-flag"),
        (["--rollout-batch-size", "3", "--global-batch-size", "8"], "must be a multiple"),
        (["--colocate-memory", "keep"], "--colocate-memory keep needs --colocate"),
        (["--colocate-memory", "auto"], "--colocate-memory auto needs --colocate"),
        (
            ["--colocate", "--colocate-memory", "auto", "--rollout-backend", "sglang"],
            "--colocate-memory auto weighs the engine's --sglang-mem-fraction-static",
        ),
        (
            ["--colocate", "--colocate-memory", "keep", "--lora-base-cpu-backup"],
            "which --colocate-memory keep never does; drop one of them",
        ),
    ],
)
def test_bad_argv_is_one_line_and_exit_2(argv, message):
    done = run_train_py("--hf-checkpoint", "m", "--prompt-data", "p.jsonl", *argv)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("train.py: error: ")
    assert message in done.stderr and done.stdout == ""


def test_auto_without_safetensors_stops_before_ray_starts(tiny_dirs, tmp_path):
    model, data = tiny_dirs
    unsized = tmp_path / "unsized"
    unsized.mkdir()
    for path in model.iterdir():
        if path.suffix != ".safetensors":
            (unsized / path.name).write_bytes(path.read_bytes())
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    done = run_train_py(
        *recipe_argv(unsized, data, tmp_path, "--colocate", "--colocate-memory", "auto"),
        env={"RAY_TMPDIR": str(ray_tmp)},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"train.py: error: --colocate-memory auto: {unsized}: no *.safetensors files to size "
        "the model from; choose release or keep"
    ]
    assert not any(ray_tmp.iterdir())


def test_bad_inputs_stop_before_ray_starts(tiny_dirs, tmp_path):
    model, data = tiny_dirs
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {"RAY_TMPDIR": str(ray_tmp)}
    missing = run_train_py("--hf-checkpoint", str(model), "--prompt-data", "nope.jsonl", env=env)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        "train.py: error: prompt data not found: nope.jsonl"
    ]
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").write_text("7\n")
    broken = run_train_py(
        *recipe_argv(model, data, tmp_path, "--load", str(tmp_path / "ckpt")), env=env
    )
    assert broken.returncode == 2
    assert "names iteration 7, which is incomplete" in broken.stderr.strip().splitlines()[-1]
    assert list(ray_tmp.iterdir()) == []


def test_lora_targets_the_model_cannot_take_stop_before_ray_starts(tiny_dirs, tmp_path):
    """The wiring of `trainer.backends.torch.targets` into train.py (its cases:
    tests/trainer/backends/torch/test_targets.py)."""
    model, data = tiny_dirs
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    lora = ["--target-modules", "embed_tokens,q_proj", "--lora-serving", "merged"]
    done = run_train_py(
        *recipe_argv(model, data, tmp_path, *lora), env={"RAY_TMPDIR": str(ray_tmp)}
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "train.py: error: --lora-serving merged merges linear layers; model.embed_tokens is a "
        "Embedding: leave it out of --target-modules"
    ]
    assert not any(ray_tmp.iterdir())


def test_validate_only_prints_the_config_and_imports_nothing_heavy(tmp_path):
    code = (
        "import sys; from trainer.job.main import main; "
        "rc = main(['--hf-checkpoint', 'm', '--prompt-data', 'p.jsonl', '--validate-only']); "
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'peft') if m in sys.modules]; "
        "print('HEAVY', heavy, rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    config_text, _, tail = done.stdout.rpartition("HEAVY")
    assert tail.strip() == "[] 0"
    assert json.loads(config_text)["hf_checkpoint"] == "m"


def constant_reward(args, sample) -> dict:
    """A miles-style custom reward for the options test: (args, sample) -> dict, read by key;
    `args` is miles' flat namespace of the settings."""
    assert args.n_samples_per_prompt == 4 and args.rm_type == "tiny"
    return {"score": 0.25, "other": 9.0}


MILES_FILTER = "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
OPTIONS = {
    "defaults": ([], set()),
    "tis": (["--use-tis", "--tis-clip", "1.5", "--tis-clip-low", "0.5"], {"train/tis"}),
    "dual clip": (["--eps-clip-c", "3"], set()),
    "dr.grpo": (
        ["--loss-agg", "seq-mean-token-sum-norm", "--disable-grpo-std-normalization"],
        set(),
    ),
    "gspo": (["--advantage-estimator", "gspo"], set()),
    "whitened": (["--normalize-advantages", "--calculate-per-token-loss"], set()),
    "whitened, truncated ones dropped": (["--normalize-advantages", "--overlong-filter"], set()),
    "dynamic sampling": (
        ["--over-sampling-batch-size", "8", "--dynamic-sampling-filter-path", MILES_FILTER],
        {"rollout/dynamic_sampling_rounds", "rollout/dynamic_sampling_dropped"},
    ),
    "steps per rollout": (["--num-steps-per-rollout", "4", "--global-batch-size", "4"], set()),
    "stops": (["--rollout-stop-token-ids", "8", "--rollout-stop", "blue"], set()),
    "overlong": (
        ["--overlong-filter", "--overlong-buffer-len", "2", "--overlong-penalty-factor", "0.5"],
        {"rollout/overlong_penalty_mean"},
    ),
    "custom reward": (
        ["--custom-rm-path", "tests.trainer.test_loop.constant_reward", "--reward-key", "score"],
        set(),
    ),
    "chat kwargs and miles no-ops": (
        [
            "--apply-chat-template-kwargs",
            '{"enable_thinking": false}',
            "--kl-coef",
            "0",
            "--ref-load",
            "/ref",
        ],
        set(),
    ),
}
OPTIONAL_KEYS = {key for _, keys in OPTIONS.values() for key in keys}


@pytest.mark.parametrize("name", OPTIONS)
def test_each_option_trains_the_tiny_recipe(tiny_dirs, tmp_path, name):
    model, data = tiny_dirs
    extra, keys = OPTIONS[name]
    loop, _ = make_loop(recipe_argv(model, data, tmp_path, "--num-rollout", "2", *extra))
    loop.run()
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        assert keys <= record.keys() and not (OPTIONAL_KEYS - keys) & record.keys()
        for key in ("train/pg_loss", "train/grad_norm", "rollout/reward_mean"):
            assert torch.isfinite(torch.tensor(record[key])), (key, record[key])
        if record.get("rollout/dynamic_sampling_rounds", 32) < 32:  # kept groups all vary
            assert record["rollout/zero_std_group_ratio"] == 0.0
        if name == "custom reward":  # the function's "score", not the tiny task's reward
            assert record["rollout/reward_mean"] == 0.25


def test_call_seeds_stay_distinct_over_rollouts_rounds_and_purposes():
    """Dynamic sampling's round 8 once reused round 0's seeds (a shifted term overflowed)."""
    from trainer.backends.base import SamplingParams
    from trainer.loop import call_seed

    calls = [
        (purpose, rollout, attempt)
        for purpose in ("rollout", "eval")
        for rollout in range(50)
        for attempt in range(16)
    ]
    seeds = {call_seed(1234, *call) for call in calls}
    assert len(seeds) == len(calls)
    requests = {SamplingParams(1, seed=s).request_seed(i) for s in seeds for i in range(64)}
    assert len(requests) == len(calls) * 64
    assert call_seed(1234, "rollout", 3, 0) == call_seed(1234, "rollout", 3, 0)  # resumable


class SamplingRecorder(LocalEngines):
    """Records the sampling parameters of every generate call."""

    def __init__(self, engine, calls: list[str]) -> None:
        super().__init__(engine, calls)
        self.params: list = []

    def generate(self, prompts, params):
        self.params.append(params)
        return super().generate(prompts, params)


@pytest.mark.parametrize(
    ("extra", "seeded"), [((), True), (("--no-rollout-request-seeds",), False)]
)
def test_every_generate_call_is_seeded_unless_request_seeds_are_off(
    tiny_dirs, tmp_path, extra, seeded
):
    model, data = tiny_dirs
    loop, _ = make_loop(recipe_argv(model, data, tmp_path, "--num-rollout", "2", *extra),
                        SamplingRecorder)  # fmt: skip
    loop.run()
    assert len(loop.engines.params) == 2
    assert all((p.seed is not None) == seeded for p in loop.engines.params)
