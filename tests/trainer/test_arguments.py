"""The argv contract: flag names, defaults, derived values and one-line usage errors."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from trainer import arguments
from trainer.arguments import UsageError, parse_args, parse_args_or_exit, render
from trainer.job.main import main as train_main

BASE = ["--hf-checkpoint", "/models/tiny", "--prompt-data", "/data/train.jsonl"]

# What the AMD Qwen3-4B recipe (DESIGN.md section 2) hands to train.py.
AMD_ARGV = shlex.split(
    """
    --hf-checkpoint /root/models/Qwen3-4B --load /root/ckpt --save /root/ckpt --save-interval 20
    --megatron-to-hf-mode bridge
    --lora-rank 64 --lora-alpha 32 --lora-dropout 0.0 --target-modules "all-linear"
    --lora-base-cpu-backup
    --prompt-data /root/data/dapo-math-17k.jsonl --input-key prompt --label-key label
    --apply-chat-template --rollout-shuffle --rm-type deepscaler --num-rollout 100
    --rollout-batch-size 8 --n-samples-per-prompt 8 --rollout-max-response-len 8192
    --rollout-temperature 1 --global-batch-size 64 --balance-data
    --eval-interval 20 --eval-prompt-data aime /root/data/aime-2024.jsonl
    --n-samples-per-eval-prompt 16 --eval-max-response-len 16384 --eval-top-p 1
    --optimizer adam --lr 2e-5 --lr-decay-style constant --weight-decay 0.1
    --adam-beta1 0.9 --adam-beta2 0.98
    --advantage-estimator grpo --use-kl-loss --kl-loss-coef 0.00 --kl-loss-type low_var_kl
    --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28
    --use-wandb --wandb-project miles-lora --wandb-group qwen3-4b-amd --wandb-mode offline
    --rollout-num-gpus-per-engine 1 --sglang-mem-fraction-static 0.4
    --sglang-chunked-prefill-size 4096 --sglang-lora-backend triton
    --sglang-attention-backend triton
    --train-backend megatron --rollout-backend sglang --actor-num-nodes 1
    --actor-num-gpus-per-node 8 --num-gpus-per-node 8 --colocate
    --tensor-model-parallel-size 2 --sequence-parallel --recompute-granularity full
    --recompute-method uniform --recompute-num-layers 1 --use-dynamic-batch-size
    --max-tokens-per-gpu 9216 --attention-dropout 0.0 --hidden-dropout 0.0
    --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
    """
)


def error_of(argv: list[str]) -> str:
    with pytest.raises(UsageError) as info:
        parse_args(argv)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_small_defaults_resolve_derived_values() -> None:
    args = parse_args(BASE)
    assert (
        args.lora.lora_rank == 16
        and args.lora.lora_alpha == 32.0
        and args.lora.target_modules == "all-linear"
    )
    assert args.placement.train_backend == "torch" and args.placement.rollout_backend == "hf"
    assert args.algorithm.eps_clip_high == args.algorithm.eps_clip == 0.2
    assert (
        args.batch.global_batch_size
        == args.rollout.rollout_batch_size * args.rollout.n_samples_per_prompt
    )
    assert args.rollout.num_epoch == 1 and args.rollout.num_rollout is None
    assert args.placement.rollout_num_gpus == 1 and args.placement.num_gpus_per_node == 1
    assert args.placement.device == "auto" and args.placement.dtype == "auto"
    # miles' defaults: group std normalisation on, no whitening, k1, per-sample mean
    assert (
        args.algorithm.grpo_std_normalization is True
        and args.algorithm.normalize_advantages is False
    )
    assert args.algorithm.kl_loss_type == "k1" and args.algorithm.loss_agg == "seq-mean-token-mean"
    assert args.sglang.sglang_extra == {} and args.eval.eval_datasets == {}
    assert args.eval.eval_max_response_len == args.rollout.rollout_max_response_len
    assert args.checkpoint.output_dir == "./outputs" and args.misc.seed == 1234


def test_production_argv_is_accepted() -> None:
    args = parse_args(AMD_ARGV)
    assert args.placement.rollout_num_gpus == 8  # colocated: the actor's GPUs
    assert args.placement.device == "cuda" and args.placement.dtype == "bf16"
    assert args.algorithm.eps_clip_high == 0.28 and args.lora.lora_alpha == 32.0
    assert args.eval.eval_datasets == {"aime": "/root/data/aime-2024.jsonl"}
    assert args.data_parallel_size == 4  # 8 GPUs / TP 2
    assert (
        args.sglang.sglang_lora_backend == "triton"
        and args.sglang.sglang_chunked_prefill_size == 4096
    )


def test_undeclared_sglang_flags_are_collected() -> None:
    args = parse_args(
        [
            *BASE,
            "--rollout-backend",
            "sglang",
            "--sglang-max-running-requests=64",
            "--sglang-enable-metrics",
            "--sglang-cuda-graph-bs-decode",
            "1",
            "2",
            "4",
            "--sglang-log_level",
            "warning",
            "--lr",
            "1e-4",
        ]
    )
    assert args.sglang.sglang_extra == {
        "max-running-requests": "64",
        "enable-metrics": "true",
        "cuda-graph-bs-decode": "1 2 4",
        "log-level": "warning",
    }
    assert args.optimizer.lr == 1e-4


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("--lora-rnak 8", "unrecognized argument --lora-rnak (did you mean --lora-rank"),
        ("--lora", "unrecognized argument --lora"),
        ("--wandb-key s3cret", "--wandb-key is not accepted"),
        ("--use-wandb s3cret", "unexpected value after --use-wandb"),
        ("--lr fast", "argument --lr: invalid float value: 'fast'"),
        ("--lr nan", "--lr must be a finite number (got nan)"),
        ("--eps-clip inf", "--eps-clip must be a finite number (got inf)"),
        ("--lora-dropout Infinity", "--lora-dropout must be a finite number (got inf)"),
        ("--lr", "argument --lr: expected one argument"),
        ("--rm-type nope", "argument --rm-type: invalid choice: 'nope'"),
        ("--train-backend jax", "argument --train-backend: invalid choice"),
        ("--lora-rank 0", "--lora-rank must be > 0 (got 0)"),
        ("--lora-alpha -1", "--lora-alpha must be > 0 (got -1.0)"),
        ("--lora-dropout 1.0", "--lora-dropout must be in [0, 1) (got 1.0)"),
        ("--lora-dropout 0.3", "--lora-dropout 0.3 is refused: old log-probs come without dropout"),
        (
            "--lora-serving merged --train-backend megatron",
            "--lora-serving merged trains the policy through the merged weights, which only",
        ),
        ("--eps-clip -0.1", "--eps-clip must be >= 0 (got -0.1)"),
        ("--eps-clip-high -0.1", "--eps-clip-high must be >= 0"),
        ("--rollout-top-p 0", "--rollout-top-p must be in (0, 1]"),
        ("--rollout-top-k 0", "--rollout-top-k must be -1 (off) or > 0"),
        (
            "--rollout-batch-size 3 --n-samples-per-prompt 4 --global-batch-size 8",
            "samples per rollout (--rollout-batch-size 3 x --n-samples-per-prompt 4 = 12) "
            "must be a multiple of --global-batch-size 8",
        ),
        (
            "--actor-num-gpus-per-node 3 --rollout-num-gpus-per-engine 2",
            "actor GPUs (1 node(s) x 3 = 3) must be divisible by --rollout-num-gpus-per-engine 2",
        ),
        (
            "--actor-num-gpus-per-node 3 --global-batch-size 8 --rollout-batch-size 8 "
            "--n-samples-per-prompt 2",
            "--global-batch-size 8 must be divisible by the data-parallel size 3",
        ),
        (
            "--global-batch-size 4 --micro-batch-size 3",
            "per-rank batch (4 / 1 data-parallel ranks = 4) must be divisible by "
            "--micro-batch-size 3",
        ),
        ("--eval-prompt-data aime", "--eval-prompt-data takes NAME PATH pairs"),
        ("--eval-prompt-data a x a y", "--eval-prompt-data names must be unique"),
        ("--eval-interval 5", "--eval-interval needs --eval-prompt-data"),
        ("--save-interval 5", "--save-interval needs --save"),
        ("--tensor-model-parallel-size 2", "--tensor-model-parallel-size 2 needs"),
        ("--target-modules all-linear,q_proj", '"all-linear" cannot be combined'),
        ("--target-modules ' , '", "--target-modules must be"),
        ("--sglang-lora-backend triton", "--sglang-lora-backend needs --rollout-backend"),
        ("--sglang-foo 1", "--sglang-foo needs --rollout-backend sglang"),
        ("--use-dynamic-batch-size", "--use-dynamic-batch-size needs --max-tokens-per-gpu"),
        (
            "--gradient-checkpointing-layers 4",
            "--gradient-checkpointing-layers needs --gradient-checkpointing",
        ),
        (
            "--gradient-checkpointing --gradient-checkpointing-layers -2",
            "--gradient-checkpointing-layers must be -1 (every layer), >= 0 or auto (got -2)",
        ),
        (
            "--gradient-checkpointing --gradient-checkpointing-layers most",
            "--gradient-checkpointing-layers: must be a number of layers or auto, not 'most'",
        ),
        (
            "--gradient-checkpointing-layers auto",
            "--gradient-checkpointing-layers needs --gradient-checkpointing",
        ),
        (
            "--recompute-granularity full",
            "--recompute-granularity full needs --recompute-method and --recompute-num-layers",
        ),
        ("--colocate --rollout-num-gpus 2", "--colocate shares the actor's 1 GPU(s)"),
        ("--device cpu --train-backend megatron", "--device cpu works only with"),
        ("--min-lr 1 --lr 0.1", "--min-lr (1.0) must not exceed --lr (0.1)"),
        ("stray", "unexpected value after --prompt-data (train.py takes only --flags)"),
    ],
)
def test_bad_argv_is_one_line(extra: str, expected: str) -> None:
    assert expected in error_of([*BASE, *shlex.split(extra)])


def test_error_never_echoes_a_secret_value() -> None:
    for argv in (["--wandb-key=s3cret"], ["--wandb-key", "s3cret"], ["--use-wandb", "s3cret"]):
        assert "s3cret" not in error_of([*BASE, *argv])


def test_stray_value_first() -> None:
    assert error_of(["stray", *BASE]).startswith("unexpected value before any flag")


def test_required_flags() -> None:
    assert error_of(["--prompt-data", "p"]).endswith("required: --hf-checkpoint")
    assert "--prompt-data" in error_of(["--hf-checkpoint", "m"])


def test_load_without_save_is_fine_and_pairs_parse() -> None:
    args = parse_args([*BASE, "--load", "/ckpt", "--eval-prompt-data", "a", "x", "b", "y"])
    assert args.checkpoint.load == "/ckpt" and args.checkpoint.save is None
    assert args.eval.eval_datasets == {"a": "x", "b": "y"}


def test_miles_advantage_flags_keep_their_miles_meaning() -> None:
    args = parse_args(
        [
            *BASE,
            "--normalize-advantages",
            "--disable-grpo-std-normalization",
            "--kl-loss-type",
            "k3",
        ]
    )
    assert (
        args.algorithm.normalize_advantages is True
        and args.algorithm.grpo_std_normalization is False
    )
    assert args.algorithm.kl_loss_type == "k3"
    assert args.algorithm.meanings(args.rollout)["advantage"] == (
        "reward - group mean, then whitened over all response tokens of the rollout"
    )
    with pytest.raises(UsageError, match="unrecognized argument --no-normalize-advantages"):
        parse_args([*BASE, "--no-normalize-advantages"])


def test_validate_only_shows_the_miles_meanings_of_a_miles_argv(capsys) -> None:
    miles = [
        "--normalize-advantages",
        "--disable-grpo-std-normalization",
        "--eps-clip-high",
        "0.28",
    ]
    assert train_main([*BASE, *miles, "--use-tis", "--eps-clip-c", "3", "--validate-only"]) == 0
    meanings = json.loads(capsys.readouterr().out)["meanings"]
    assert meanings == {
        "advantage": "reward - group mean, then whitened over all response tokens of the rollout",
        "loss_aggregation": "seq-mean-token-mean",
        "kl": "k1 estimator, off (no reference forward)",
        "policy_loss": "PPO ratio per token clipped to [0.8, 1.28], dual clip 3, "
        "TIS weights in [0, 2]",
    }


def test_a_group_of_one_has_no_std_normalisation() -> None:
    assert (
        parse_args([*BASE, "--n-samples-per-prompt", "1"]).algorithm.grpo_std_normalization is False
    )


@pytest.mark.parametrize(
    ("extra", "agg"),
    [
        ([], "seq-mean-token-mean"),
        (["--calculate-per-token-loss"], "token-mean"),
        (["--loss-agg", "seq-mean-token-sum"], "seq-mean-token-sum"),
        (["--calculate-per-token-loss", "--loss-agg", "token-mean"], "token-mean"),
    ],
)
def test_loss_aggregation_follows_miles_unless_loss_agg_says_otherwise(extra, agg) -> None:
    assert parse_args([*BASE, *extra]).algorithm.loss_agg == agg


def test_per_token_loss_and_a_per_sample_loss_agg_contradict() -> None:
    with pytest.raises(UsageError, match="--calculate-per-token-loss is token-mean"):
        parse_args([*BASE, "--calculate-per-token-loss", "--loss-agg", "seq-mean-token-mean"])


def test_wandb_mode_follows_the_key_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert parse_args(BASE).wandb.wandb_mode == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert parse_args(BASE).wandb.wandb_mode == "online"
    assert parse_args([*BASE, "--wandb-mode", "disabled"]).wandb.wandb_mode == "disabled"
    assert not any(a.option_strings == ["--wandb-key"] for a in arguments.build_parser()._actions)


def test_device_and_dtype_resolution() -> None:
    args = parse_args([*BASE, "--device", "cpu"])
    assert args.placement.dtype == "fp32"
    assert args.placement.resolve_device() == "cpu"
    args = parse_args([*BASE, "--device", "cuda"])
    assert args.placement.dtype == "bf16"
    args = parse_args([*BASE, "--device", "cuda", "--dtype", "fp32"])
    assert args.placement.dtype == "fp32"
    auto = parse_args(BASE)
    assert auto.placement.resolve_dtype("cpu") == "fp32"
    assert auto.placement.resolve_dtype("cuda") == "bf16"


def test_module_lists() -> None:
    args = parse_args([*BASE, "--target-modules", "q_proj, v_proj", "--exclude-modules", "lm_head"])
    assert args.lora.modules() == ("q_proj", "v_proj")
    assert args.lora.excluded() == ("lm_head",)
    assert parse_args(BASE).lora.modules() == "all-linear"
    assert parse_args(BASE).lora.excluded() == ()


def test_resolved_config_is_json_and_redacts_secret_extras() -> None:
    argv = [*BASE, "--rollout-backend", "sglang", "--sglang-api-key", "s3cret"]
    config = parse_args(argv).as_dict()
    text = json.dumps(config)
    assert "s3cret" not in text
    assert config["sglang_extra"] == {"api-key": "<redacted>"}
    assert list(config) == sorted(config)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api-key", True),
        ("admin-api-key", True),
        ("ssl-keyfile-password", True),
        ("tokenizer-path", False),
        ("max-total-tokens", False),
        ("ssl-keyfile", False),
        ("speculative-token-map", False),
    ],
)
def test_the_trainer_redacts_with_the_harness_pattern(name: str, secret: bool) -> None:
    """One pattern says what a secret is, for the launcher's recordings and the trainer's
    config alike (the trainer's own substring match hid paths and token counts)."""
    from common.secrets import is_secret

    argv = [*BASE, "--rollout-backend", "sglang", f"--sglang-{name}", "4096"]
    config = parse_args(argv).as_dict()
    assert (config["sglang_extra"][name] == "<redacted>") is secret is is_secret(name)


def test_parse_args_or_exit_prints_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args_or_exit([*BASE, "--lora-rank", "0"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == "train.py: error: --lora-rank must be > 0 (got 0)\n"
    assert parse_args_or_exit(BASE).lora.lora_rank == 16


def test_unknown_sglang_flag_is_rejected_with_close_names() -> None:
    message = error_of([*AMD_ARGV, "--sglang-enable-lorra", "true"])
    assert message.startswith("--sglang-enable-lorra: unknown SGLang server argument")
    assert "--sglang-enable-lora" in message


# Each flag of issue 12's yardstick with a value miles' own launchers use, and what it resolves to.
YARDSTICK = [
    ("--use-tis", {"use_tis": True}),
    ("--use-tis --tis-clip 2.0 --tis-clip-low 0.0", {"tis_clip": 2.0, "tis_clip_low": 0.0}),
    ("--eps-clip-c 3", {"eps_clip_c": 3.0}),
    ("--rollout-batch-size 32 --over-sampling-batch-size 64", {"over_sampling_batch_size": 64}),
    (
        "--dynamic-sampling-filter-path "
        "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
        {"dynamic_sampling_filter_path": "trainer.grpo.filters.check_reward_nonzero_std"},
    ),
    ("--rollout-stop-token-ids 151643 151645", {"rollout_stop_token_ids": [151643, 151645]}),
    ("--rollout-stop '</answer>'", {"rollout_stop": ["</answer>"]}),
    (
        """--apply-chat-template-kwargs '{"enable_thinking": false}'""",
        {"apply_chat_template_kwargs": {"enable_thinking": False}},
    ),
    (
        "--custom-rm-path examples.math.reward.score",
        {"custom_rm_path": "examples.math.reward.score"},
    ),
    ("--num-steps-per-rollout 2", {"num_steps_per_rollout": 2, "global_batch_size": 8}),
    ("--kl-coef 0.00", {"kl_coef": 0.0}),
    ("--ref-load /root/Qwen3-4B_torch_dist", {"ref_load": "/root/Qwen3-4B_torch_dist"}),
    ("--calculate-per-token-loss", {"loss_agg": "token-mean"}),
    ("--reward-key score", {"reward_key": "score"}),
    ("--log-probs-chunk-size 1024", {"log_probs_chunk_size": 1024}),
    (
        "--use-dynamic-global-batch-size --use-dynamic-batch-size --max-tokens-per-gpu 9216",
        {"use_dynamic_global_batch_size": True},
    ),
]


@pytest.mark.parametrize(("flags", "resolved"), YARDSTICK, ids=[y[0][:40] for y in YARDSTICK])
def test_miles_yardstick_flags_pass_validate_only(flags, resolved, capsys) -> None:
    assert train_main([*BASE, *shlex.split(flags), "--validate-only"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert {key: config[key] for key in resolved} == resolved


def test_new_options_are_off_by_default() -> None:
    args = parse_args(BASE)
    assert (
        args.algorithm.use_tis,
        args.algorithm.eps_clip_c,
        args.rollout.dynamic_sampling_filter_path,
    ) == (False, None, None)
    assert (
        args.reward.custom_rm_path,
        args.reward.reward_key,
        args.rollout.rollout_stop_token_ids,
    ) == (None, None, None)
    assert (
        args.data.apply_chat_template_kwargs == {} and args.algorithm.advantage_estimator == "grpo"
    )
    assert args.rollout.over_sampling_batch_size == args.rollout.rollout_batch_size
    assert (args.algorithm.overlong_filter, args.algorithm.overlong_buffer_len) == (False, None)
    assert (args.lora.lora_serving, args.rollout.rollout_request_seeds) == ("adapter", True)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--eps-clip-c 0.9", "--eps-clip-c must be > 1 (got 0.9)"),
        ("--use-tis --tis-clip 1 --tis-clip-low 2", "--tis-clip-low (2.0) must not exceed"),
        ("--kl-coef 0.1", "--kl-coef shapes rewards only for ppo/reinforce++ in miles"),
        ("--num-steps-per-rollout 2 --global-batch-size 16", "is not the rollout's samples / "),
        ("--custom-rm-path reward", "--custom-rm-path must be module.function (got reward)"),
        ("--apply-chat-template-kwargs [1]", "--apply-chat-template-kwargs: must be a JSON object"),
        ("--over-sampling-batch-size 2", "--over-sampling-batch-size 2 must be >= --rollout-batch"),
        ("--use-dynamic-global-batch-size", "needs --use-dynamic-batch-size"),
        ("--overlong-buffer-len 0", "--overlong-buffer-len must be in (0, --rollout-max-response"),
        ("--num-layers 36", "--num-layers is a Megatron architecture flag: Bridge mode reads"),
        ("--moe-router-topk 8", "--moe-router-topk is a Megatron architecture flag"),
        ("--lora-serving lora", "--lora-serving: invalid choice: 'lora'"),
    ],
)
def test_bad_option_values_are_one_line_errors(flags: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_args([*BASE, *shlex.split(flags)])


RENDERED = {
    "defaults": BASE,
    "AMD recipe": AMD_ARGV,
    "miles flags": [
        *BASE, "--disable-grpo-std-normalization", "--normalize-advantages", "--use-tis",
        "--rollout-stop", "</answer>", "\n\n", "--rollout-stop-token-ids", "151643", "-1",
        "--apply-chat-template-kwargs", '{"enable_thinking": false}', "--wandb-run-name=-run",
        "--wandb-project", "", "--eval-prompt-data", "a", "/x", "--lr", "3e-06",
    ],
    "serving": [*BASE, "--lora-serving", "merged", "--no-rollout-request-seeds"],
    "sglang extras": [
        *BASE, "--rollout-backend", "sglang", "--sglang-enable-metrics",
        "--sglang-cuda-graph-bs-decode", "1", "2", "--sglang-log-level=-x", "--sglang-api-key=",
    ],
}  # fmt: skip


@pytest.mark.parametrize("argv", RENDERED.values(), ids=RENDERED.keys())
def test_render_is_the_inverse_of_parsing(argv: list[str]) -> None:
    config = parse_args(argv)
    rendered = render(config)
    assert parse_args(rendered) == config
    assert render(parse_args(rendered)) == rendered


def test_render_gives_only_what_differs_from_the_defaults() -> None:
    from trainer.config import CheckpointConfig, DataConfig, LoraConfig, TrainConfig

    config = TrainConfig(
        checkpoint=CheckpointConfig(hf_checkpoint="/m"),
        data=DataConfig(prompt_data="/d"),
        lora=LoraConfig(lora_rank=64, lora_base_cpu_backup=True),
    )
    assert render(config) == [
        "--hf-checkpoint", "/m", "--lora-rank", "64", "--lora-base-cpu-backup",
        "--prompt-data", "/d",
    ]  # fmt: skip
    assert parse_args(render(config)).lora == config.lora


def test_every_setting_has_one_name_across_the_groups() -> None:
    import dataclasses
    import typing

    from trainer.config import TrainConfig

    names = [
        field.name
        for group in typing.get_type_hints(TrainConfig).values()
        for field in dataclasses.fields(group)
    ]
    assert len(names) == len(set(names))
    assert set(parse_args(BASE).as_dict()) == {*names, "meanings"}


def test_parsing_needs_no_torch() -> None:
    """Launchers check their argv with this parser on a base install (no torch)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from tests.trainer.test_arguments import AMD_ARGV\n"
        "from trainer.arguments import parse_args\n"
        "print(parse_args(AMD_ARGV).placement.train_backend)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "megatron\n"
