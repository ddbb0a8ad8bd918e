"""The argv contract of ``train.py``: every flag, its type and default, and its validation.

`parse_args` parses AND validates; any problem raises `UsageError` with a one-line message (never
SystemExit, never a traceback for the user). `parse_args_or_exit` is what ``train.py`` calls: it
prints ``train.py: error: <message>`` and exits 2. Derived defaults (``--eps-clip-high``,
``--rollout-num-gpus``, ``--global-batch-size``, ...) are filled in by `parse_args`, so every
consumer reads resolved values. Nothing here touches the filesystem or probes devices: launchers
validate recorded argv with `parse_args` on hosts where the paths and GPUs do not exist.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from harness.secrets import REDACTED, is_secret
from trainer.rewards import reward_names

PROG = "train.py"
MAX_SEED = 2**32 - 1  # numpy's and SGLang's seeds are 32-bit
SGLANG_PREFIX = "--sglang-"
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+([eE][-+]?\d+)?$|^-\d+[eE][-+]?\d+$")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
MILES_NONZERO_STD_FILTER = (
    "miles.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
)
# Megatron model-architecture flags of miles' launchers: Bridge mode reads them from the HF config.
_MEGATRON_ARCHITECTURE = frozenset(
    [
        "--num-layers",
        "--hidden-size",
        "--ffn-hidden-size",
        "--num-attention-heads",
        "--group-query-attention",
        "--num-query-groups",
        "--kv-channels",
        "--max-position-embeddings",
        "--position-embedding-type",
        "--rotary-base",
        "--rotary-percent",
        "--rotary-scaling-factor",
        "--normalization",
        "--norm-epsilon",
        "--swiglu",
        "--untie-embeddings-and-output-weights",
        "--vocab-size",
        "--make-vocab-size-divisible-by",
        "--disable-bias-linear",
        "--add-qkv-bias",
        "--qk-layernorm",
        "--use-rotary-position-embeddings",
        "--seq-length",
        "--multi-latent-attention",
        "--q-lora-rank",
        "--kv-lora-rank",
        "--qk-head-dim",
        "--qk-pos-emb-head-dim",
        "--v-head-dim",
        "--num-experts",
        "--spec",
    ]
)
KL_TYPES = ("k1", "k2", "k3", "low_var_kl")


class UsageError(Exception):
    """Bad user input (argv or the data it names): reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(" ".join(message.split()))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="GRPO LoRA trainer on Ray.",
        allow_abbrev=False,
    )

    g = p.add_argument_group("checkpoint")
    g.add_argument("--hf-checkpoint", required=True, help="HF model directory (the base model)")
    g.add_argument("--load", help="resume directory; a missing or empty directory starts fresh")
    g.add_argument("--save", help="checkpoint directory")
    g.add_argument("--save-interval", type=int, help="save every N rollouts (and at the end)")
    g.add_argument("--megatron-to-hf-mode", choices=("raw", "bridge"), default="bridge")
    g.add_argument("--output-dir", default="./outputs", help="metrics.jsonl, summary, wandb dir")
    g.add_argument("--seed", type=int, default=1234)

    g = p.add_argument_group("LoRA")
    g.add_argument("--lora-rank", type=int, default=16)
    g.add_argument("--lora-alpha", type=float, default=32.0)
    g.add_argument("--lora-dropout", type=float, default=0.0)
    g.add_argument("--target-modules", default="all-linear", help='comma list or "all-linear"')
    g.add_argument("--exclude-modules", help="comma list of modules to leave without LoRA")
    g.add_argument("--lora-base-cpu-backup", action="store_true")

    g = p.add_argument_group("data and rollout")
    g.add_argument("--prompt-data", required=True, help="JSONL or Parquet prompt set")
    g.add_argument("--input-key", default="prompt")
    g.add_argument("--label-key", default="label")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument(
        "--apply-chat-template-kwargs",
        type=_json_object,
        default={},
        help="JSON object for the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--num-epoch", type=int, help="epochs to train when --num-rollout is unset")
    g.add_argument("--rm-type", choices=reward_names(), default="math")
    g.add_argument(
        "--custom-rm-path",
        help="module.function called as fn(args, sample) -> reward (may be async), as in miles",
    )
    g.add_argument("--reward-key", help="the key of the reward in a reward function's dict")
    g.add_argument(
        "--over-sampling-batch-size",
        type=int,
        help="prompts per generation round with dynamic sampling (default --rollout-batch-size)",
    )
    g.add_argument(
        "--dynamic-sampling-filter-path",
        help="module.function(args, group) -> keep?; miles' check_reward_nonzero_std path works",
    )
    g.add_argument(
        "--overlong-filter",
        action="store_true",
        help="DAPO: truncated responses (no EOS within the length limit) count in no loss",
    )
    g.add_argument(
        "--overlong-buffer-len",
        type=int,
        help="DAPO soft overlong penalty: tokens before --rollout-max-response-len where it starts",
    )
    g.add_argument(
        "--overlong-penalty-factor",
        type=float,
        default=1.0,
        help="the reward penalty at --rollout-max-response-len (with --overlong-buffer-len)",
    )
    g.add_argument(
        "--rollout-stop",
        nargs="+",
        metavar="TEXT",
        help="stop strings: a response ends with the first one it produces",
    )
    g.add_argument(
        "--rollout-stop-token-ids",
        type=int,
        nargs="+",
        metavar="ID",
        help="token ids that end a response, besides EOS",
    )
    g.add_argument("--num-rollout", type=int, help="rollout (= optimizer update) count")
    g.add_argument("--rollout-batch-size", type=int, default=4, help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=4, help="GRPO group size")
    g.add_argument("--rollout-max-prompt-len", type=int, help="drop longer prompts (tokens)")
    g.add_argument("--rollout-max-response-len", type=int, default=256)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1, help="-1 disables top-k")
    g.add_argument("--global-batch-size", type=int, help="samples per optimizer step")
    g.add_argument(
        "--num-steps-per-rollout",
        type=int,
        help="optimizer steps per rollout: sets --global-batch-size to the rollout's samples / N",
    )
    g.add_argument(
        "--use-dynamic-global-batch-size",
        action="store_true",
        help="miles' flag, accepted as a check: the rollout's samples must already make one "
        "optimizer step (--global-batch-size); needs --use-dynamic-batch-size",
    )
    g.add_argument("--micro-batch-size", type=int, default=1)
    g.add_argument("--balance-data", action="store_true")

    g = p.add_argument_group("eval")
    g.add_argument("--eval-interval", type=int)
    g.add_argument("--eval-prompt-data", nargs="+", metavar="NAME PATH")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-max-response-len", type=int)
    g.add_argument("--eval-temperature", type=float)
    g.add_argument("--eval-top-p", type=float)

    g = p.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=("adam",), default="adam")
    g.add_argument("--lr", type=float, default=1e-5)
    g.add_argument("--lr-decay-style", choices=("constant", "cosine", "linear"), default="constant")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.98)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--clip-grad", type=float, default=1.0, help="max grad norm; 0 disables")

    g = p.add_argument_group("GRPO")
    g.add_argument(
        "--advantage-estimator",
        choices=("grpo", "gspo"),
        default="grpo",
        help="gspo: GRPO advantages with one (sequence-level) ratio per response",
    )
    g.add_argument(
        "--ref-load",
        help="reference checkpoint; with LoRA the reference is --hf-checkpoint without the adapter",
    )
    g.add_argument(
        "--kl-coef",
        type=float,
        default=0.0,
        help="reward-shaping KL (miles: ppo/reinforce++ only; no effect with grpo, so must be 0)",
    )
    g.add_argument(
        "--disable-grpo-std-normalization",
        dest="grpo_std_normalization",
        action="store_false",
        help="only centre rewards on the group mean (Dr.GRPO); by default also divide by the std",
    )
    g.add_argument(
        "--normalize-advantages",
        action="store_true",
        help="whiten the advantages over all response tokens of the rollout (every DP rank)",
    )
    g.add_argument("--use-kl-loss", action="store_true")
    g.add_argument("--kl-loss-coef", type=float, default=0.0)
    g.add_argument("--kl-loss-type", choices=KL_TYPES, default="k1")
    g.add_argument("--entropy-coef", type=float, default=0.0)
    g.add_argument("--eps-clip", type=float, default=0.2)
    g.add_argument("--eps-clip-high", type=float, help="upper clip; defaults to --eps-clip")
    g.add_argument(
        "--eps-clip-c", type=float, help="dual-clip PPO: cap a negative advantage's loss (> 1)"
    )
    g.add_argument(
        "--use-tis",
        action="store_true",
        help="truncated importance sampling against the rollout engine's log-probs",
    )
    g.add_argument("--tis-clip", type=float, default=2.0, help="upper bound of the TIS weight")
    g.add_argument("--tis-clip-low", type=float, default=0.0, help="lower bound of the TIS weight")
    g.add_argument(
        "--calculate-per-token-loss",
        action="store_true",
        help="token mean over the step (miles); default: per-sample mean (--loss-agg)",
    )
    g.add_argument(
        "--loss-agg",
        choices=AGG_MODES,
        help="this project's finer choice; default seq-mean-token-mean, or token-mean with "
        "--calculate-per-token-loss",
    )

    g = p.add_argument_group("wandb (the key comes from WANDB_API_KEY only)")
    g.add_argument("--use-wandb", action="store_true")
    g.add_argument("--wandb-project")
    g.add_argument("--wandb-group")
    g.add_argument("--wandb-run-name")
    g.add_argument(
        "--wandb-mode",
        choices=("online", "offline", "disabled"),
        help="default: online when WANDB_API_KEY is set, else offline",
    )

    g = p.add_argument_group("placement")
    g.add_argument("--train-backend", choices=("megatron", "torch"), default="torch")
    g.add_argument("--rollout-backend", choices=("sglang", "hf"), default="hf")
    g.add_argument("--actor-num-nodes", type=int, default=1)
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1)
    g.add_argument("--num-gpus-per-node", type=int, help="defaults to --actor-num-gpus-per-node")
    g.add_argument("--rollout-num-gpus", type=int, help="defaults to the actor total (colocated)")
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--colocate", action="store_true")
    g.add_argument(
        "--train-python",
        help="Python interpreter of the training actors (Ray runtime env py_executable), for a "
        "trainer whose packages cannot share the job's environment; default: the job's",
    )
    g.add_argument(
        "--rollout-python",
        help="Python interpreter of the rollout engines (as --train-python); default: the job's",
    )
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="torch backend: recompute decoder activations in backward (Megatron: --recompute-*)",
    )
    g.add_argument(
        "--log-probs-chunk-size",
        type=int,
        default=-1,
        help="torch backend: response tokens per chunk of the log-prob/entropy computation "
        "(exact either way; smaller chunks hold less of the [tokens, vocab] logits at once); "
        "-1: 512",
    )
    g.add_argument(
        "--dtype", choices=("auto", "bf16", "fp32"), default="auto", help="auto: bf16 GPU, fp32 CPU"
    )

    g = p.add_argument_group("megatron")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--recompute-granularity", choices=("full", "selective"))
    g.add_argument("--recompute-method", choices=("uniform", "block"))
    g.add_argument("--recompute-num-layers", type=int)
    g.add_argument("--use-dynamic-batch-size", action="store_true")
    g.add_argument("--max-tokens-per-gpu", type=int)
    g.add_argument("--attention-dropout", type=float, default=0.0)
    g.add_argument("--hidden-dropout", type=float, default=0.0)
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true")
    g.add_argument("--attention-softmax-in-fp32", action="store_true")

    g = p.add_argument_group("sglang (any other --sglang-<name> VALUE goes to args.sglang_extra)")
    g.add_argument("--sglang-mem-fraction-static", type=float)
    g.add_argument("--sglang-chunked-prefill-size", type=int)
    g.add_argument("--sglang-lora-backend")
    g.add_argument("--sglang-attention-backend")

    g = p.add_argument_group("misc")
    g.add_argument(
        "--validate-only", action="store_true", help="print the resolved config as JSON and exit"
    )
    g.add_argument(
        "--check-adapter-sync",
        action="store_true",
        help="after every update, compare each engine's log-probs of a fixed sequence with the "
        "trainer's (metric sync/engine_trainer_logprob_abs_diff); needs --rollout-temperature 1",
    )
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse and validate ``train.py``'s argv; raise `UsageError` on any problem."""
    parser = build_parser()
    known, sglang_extra = _split_argv(parser, list(argv))
    args = parser.parse_args(known)
    args.sglang_extra = sglang_extra
    _resolve(args)
    _validate(args)
    return args


def parse_args_or_exit(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`parse_args` for ``main``: a bad argv prints one line to stderr and exits 2."""
    try:
        return parse_args(sys.argv[1:] if argv is None else argv)
    except UsageError as err:
        exit_usage(err)


def exit_usage(err: UsageError | str) -> NoReturn:
    print(f"{PROG}: error: {err}", file=sys.stderr)
    raise SystemExit(2)


def resolved_config(args: argparse.Namespace) -> dict[str, Any]:
    """The resolved configuration as a JSON-able dict (sorted; secret-looking extras redacted)."""
    config = dict(sorted({**vars(args), "meanings": algorithm_meanings(args)}.items()))
    config["sglang_extra"] = {
        k: (REDACTED if is_secret(k) else v) for k, v in sorted(args.sglang_extra.items())
    }
    return config


def algorithm_meanings(args: argparse.Namespace) -> dict[str, str]:
    """What the GRPO flags resolve to, in words (``--validate-only`` prints it)."""
    advantage = "reward - group mean"
    if args.grpo_std_normalization:
        advantage += ", divided by the group std"
    if args.normalize_advantages:
        advantage += ", then whitened over all response tokens of the rollout"
    kl = f"{args.kl_loss_type} estimator, "
    if not args.use_kl_loss:
        kl += "off (no reference forward)"
    else:
        kl += f"in the loss x {args.kl_loss_coef}" if args.kl_loss_coef else "logged only"
    ratio = "one per response (GSPO)" if args.advantage_estimator == "gspo" else "per token"
    policy = f"PPO ratio {ratio} clipped to [{1 - args.eps_clip:g}, {1 + args.eps_clip_high:g}]"
    if args.eps_clip_c is not None:
        policy += f", dual clip {args.eps_clip_c:g}"
    if args.use_tis:
        policy += f", TIS weights in [{args.tis_clip_low:g}, {args.tis_clip:g}]"
    return {
        "advantage": advantage,
        "loss_aggregation": args.loss_agg,
        "kl": kl,
        "policy_loss": policy,
    }


def target_modules(args: argparse.Namespace) -> str | list[str]:
    """``"all-linear"`` or the list of module names LoRA wraps."""
    return "all-linear" if args.target_modules == "all-linear" else _split(args.target_modules)


def exclude_modules(args: argparse.Namespace) -> list[str]:
    return _split(args.exclude_modules) if args.exclude_modules else []


def actor_num_gpus(args: argparse.Namespace) -> int:
    return args.actor_num_nodes * args.actor_num_gpus_per_node


def data_parallel_size(args: argparse.Namespace) -> int:
    """Data-parallel ranks of the training actor group (Megatron divides out TP x PP x CP)."""
    model_parallel = 1
    if args.train_backend == "megatron":
        model_parallel = (
            args.tensor_model_parallel_size
            * args.pipeline_model_parallel_size
            * args.context_parallel_size
        )
    return actor_num_gpus(args) // model_parallel


def resolve_device(args: argparse.Namespace) -> str:
    """``cpu`` or ``cuda`` for this process; ``auto`` probes torch (imported lazily)."""
    if args.device != "auto":
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(args: argparse.Namespace, device: str) -> str:
    """``bf16`` or ``fp32``; ``auto`` is bf16 on a GPU and fp32 on CPU."""
    if args.dtype != "auto":
        return args.dtype
    return "fp32" if device == "cpu" else "bf16"


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError("must be a JSON object") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _is_flag(token: str) -> bool:
    return token.startswith("-") and not _NEGATIVE_NUMBER.match(token)


def _split_argv(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], dict[str, str]]:
    """Separate undeclared ``--sglang-*`` flags from the rest; reject any other unknown flag.

    Error messages name flags only, never values (a value may be a secret).
    """
    actions = parser._option_string_actions
    known: list[str] = []
    sglang_extra: dict[str, str] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not _is_flag(token):
            previous = next((t for t in reversed(argv[:i]) if _is_flag(t)), None)
            where = f"after {previous.split('=', 1)[0]}" if previous else "before any flag"
            raise UsageError(f"unexpected value {where} (train.py takes only --flags)")
        name, eq, inline = token.partition("=")
        action = actions.get(name)
        if action is not None:
            taken = _values_taken(action.nargs, argv, i + 1, has_inline=bool(eq))
            known.extend(argv[i : i + 1 + taken])
            i += 1 + taken
            continue
        if name.startswith(SGLANG_PREFIX) and len(name) > len(SGLANG_PREFIX):
            key = name[len(SGLANG_PREFIX) :].replace("_", "-")
            if eq:
                sglang_extra[key] = inline
                i += 1
                continue
            values = []
            i += 1
            while i < len(argv) and not _is_flag(argv[i]):
                values.append(argv[i])
                i += 1
            sglang_extra[key] = " ".join(values) if values else "true"
            continue
        raise UsageError(_unknown_flag_message(name, actions))
    return known, sglang_extra


def _values_taken(nargs: Any, argv: list[str], start: int, *, has_inline: bool) -> int:
    """How many tokens after a declared flag are its values (so strays can be reported)."""
    if has_inline or nargs == 0:
        return 0
    following = 0
    while start + following < len(argv) and not _is_flag(argv[start + following]):
        following += 1
    if nargs is None or nargs == "?":
        return min(following, 1)
    if nargs in ("+", "*"):
        return following
    return min(following, int(nargs))


def _unknown_flag_message(name: str, actions: dict[str, argparse.Action]) -> str:
    if name == "--wandb-key":
        return "--wandb-key is not accepted: put WANDB_API_KEY in the job's environment instead"
    if name in _MEGATRON_ARCHITECTURE or name.startswith("--moe-"):
        return (
            f"{name} is a Megatron architecture flag: Bridge mode reads the architecture from "
            "the HF config of --hf-checkpoint; drop it"
        )
    close = difflib.get_close_matches(name, [a for a in actions if a.startswith("--")], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"unrecognized argument {name}{hint}"


def _resolve(args: argparse.Namespace) -> None:
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.loss_agg is None:
        args.loss_agg = "token-mean" if args.calculate_per_token_loss else "seq-mean-token-mean"
    if args.n_samples_per_prompt == 1:
        args.grpo_std_normalization = False  # as miles: a group of one has no spread
    if args.num_gpus_per_node is None:
        args.num_gpus_per_node = args.actor_num_gpus_per_node
    if args.rollout_num_gpus is None:
        args.rollout_num_gpus = (
            actor_num_gpus(args) if args.colocate else args.rollout_num_gpus_per_engine
        )
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    if args.global_batch_size is None and args.num_steps_per_rollout:
        args.global_batch_size = samples // args.num_steps_per_rollout
    if args.global_batch_size is None:
        args.global_batch_size = samples
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.dynamic_sampling_filter_path == MILES_NONZERO_STD_FILTER:
        args.dynamic_sampling_filter_path = "trainer.sampling_filters.check_reward_nonzero_std"
    if args.num_rollout is None and args.num_epoch is None:
        args.num_epoch = 1
    if args.eval_max_response_len is None:
        args.eval_max_response_len = args.rollout_max_response_len
    if args.eval_temperature is None:
        args.eval_temperature = args.rollout_temperature
    if args.eval_top_p is None:
        args.eval_top_p = args.rollout_top_p
    if args.wandb_mode is None:
        args.wandb_mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if args.device == "auto" and (
        args.train_backend == "megatron" or args.rollout_backend == "sglang"
    ):
        args.device = "cuda"
    if args.dtype == "auto" and args.device != "auto":
        args.dtype = resolve_dtype(args, args.device)
    pairs = args.eval_prompt_data or []
    args.eval_datasets = dict(zip(pairs[::2], pairs[1::2], strict=False))


def _validate(args: argparse.Namespace) -> None:
    for problem in _problems(args):
        raise UsageError(problem)


def _problems(args: argparse.Namespace) -> Iterator[str]:
    for name, value in vars(args).items():
        if isinstance(value, float) and not math.isfinite(value):
            yield f"--{name.replace('_', '-')} must be a finite number (got {value})"

    def positive(*names: str) -> Iterator[str]:
        for name in names:
            value = getattr(args, name)
            if value is not None and value <= 0:
                yield f"--{name.replace('_', '-')} must be > 0 (got {value})"

    def non_negative(*names: str) -> Iterator[str]:
        for name in names:
            value = getattr(args, name)
            if value is not None and value < 0:
                yield f"--{name.replace('_', '-')} must be >= 0 (got {value})"

    if not 0 <= args.seed <= MAX_SEED:
        yield f"--seed must be in [0, {MAX_SEED}] (got {args.seed})"
    yield from positive(
        "lora_rank", "lora_alpha", "save_interval", "num_epoch", "num_rollout",
        "rollout_batch_size", "n_samples_per_prompt", "rollout_max_prompt_len",
        "rollout_max_response_len", "global_batch_size", "micro_batch_size", "eval_interval",
        "n_samples_per_eval_prompt", "eval_max_response_len", "actor_num_nodes",
        "actor_num_gpus_per_node", "num_gpus_per_node", "rollout_num_gpus",
        "rollout_num_gpus_per_engine", "tensor_model_parallel_size",
        "pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
        "recompute_num_layers", "max_tokens_per_gpu", "adam_eps",
    )  # fmt: skip
    yield from non_negative(
        "eps_clip", "eps_clip_high", "kl_loss_coef", "entropy_coef", "lr", "min_lr",
        "weight_decay", "clip_grad", "lr_warmup_iters", "rollout_temperature",
        "eval_temperature",
    )  # fmt: skip

    for name in ("lora_dropout", "attention_dropout", "hidden_dropout", "adam_beta1", "adam_beta2"):
        value = getattr(args, name)
        if not 0.0 <= value < 1.0:
            yield f"--{name.replace('_', '-')} must be in [0, 1) (got {value})"
    for name in ("rollout_top_p", "eval_top_p"):
        value = getattr(args, name)
        if not 0.0 < value <= 1.0:
            yield f"--{name.replace('_', '-')} must be in (0, 1] (got {value})"
    if args.rollout_top_k == 0 or args.rollout_top_k < -1:
        yield f"--rollout-top-k must be -1 (off) or > 0 (got {args.rollout_top_k})"
    if args.sglang_mem_fraction_static is not None and not (
        0.0 < args.sglang_mem_fraction_static < 1.0
    ):
        yield (
            f"--sglang-mem-fraction-static must be in (0, 1) "
            f"(got {args.sglang_mem_fraction_static})"
        )
    if args.check_adapter_sync and args.rollout_temperature != 1.0:
        yield (
            "--check-adapter-sync compares log-probs at temperature 1: it needs "
            f"--rollout-temperature 1 (got {args.rollout_temperature})"
        )
    if args.log_probs_chunk_size == 0 or args.log_probs_chunk_size < -1:
        yield f"--log-probs-chunk-size must be -1 or > 0 (got {args.log_probs_chunk_size})"
    for name in ("train_python", "rollout_python"):
        value = getattr(args, name)
        if value is not None and not value.startswith("/"):
            yield f"--{name.replace('_', '-')} must be an absolute path (got {value})"
    yield from positive("num_steps_per_rollout", "over_sampling_batch_size", "tis_clip")
    yield from non_negative("tis_clip_low", "overlong_penalty_factor")
    if args.overlong_buffer_len is not None and not (
        0 < args.overlong_buffer_len <= args.rollout_max_response_len
    ):
        yield (
            f"--overlong-buffer-len must be in (0, --rollout-max-response-len "
            f"{args.rollout_max_response_len}] (got {args.overlong_buffer_len})"
        )
    if args.num_steps_per_rollout and (
        args.global_batch_size * args.num_steps_per_rollout
        != args.rollout_batch_size * args.n_samples_per_prompt
    ):
        yield (
            f"--global-batch-size {args.global_batch_size} is not the rollout's samples / "
            f"--num-steps-per-rollout {args.num_steps_per_rollout}"
        )
    if args.use_dynamic_global_batch_size:
        if not args.use_dynamic_batch_size:
            yield "--use-dynamic-global-batch-size needs --use-dynamic-batch-size"
        if args.global_batch_size != args.rollout_batch_size * args.n_samples_per_prompt:
            yield "--use-dynamic-global-batch-size trains a rollout in one optimizer step"
    if args.eps_clip_c is not None and args.eps_clip_c <= 1.0:
        yield f"--eps-clip-c must be > 1 (got {args.eps_clip_c})"
    if args.use_tis and args.tis_clip_low > args.tis_clip:
        yield f"--tis-clip-low ({args.tis_clip_low}) must not exceed --tis-clip ({args.tis_clip})"
    if args.kl_coef != 0:
        yield (
            "--kl-coef shapes rewards only for ppo/reinforce++ in miles and has no effect with "
            f"--advantage-estimator {args.advantage_estimator}: use --use-kl-loss --kl-loss-coef"
        )
    if args.dynamic_sampling_filter_path and args.n_samples_per_prompt < 2:
        yield (
            "--dynamic-sampling-filter-path judges groups of samples: it needs "
            f"--n-samples-per-prompt >= 2 (got {args.n_samples_per_prompt})"
        )
    for name in ("custom_rm_path", "dynamic_sampling_filter_path"):
        value = getattr(args, name)
        if value is not None and not re.fullmatch(r"[\w.]+\.\w+", value):
            yield f"--{name.replace('_', '-')} must be module.function (got {value})"
    if args.over_sampling_batch_size < args.rollout_batch_size:
        yield (
            f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
            f"--rollout-batch-size {args.rollout_batch_size}"
        )
    if args.lora_dropout > 0:
        yield (
            f"--lora-dropout {args.lora_dropout} is refused: old log-probs come without dropout "
            "and the training forward drops out, so the on-policy PPO ratio is not 1; use 0"
        )
    if args.calculate_per_token_loss and args.loss_agg != "token-mean":
        yield f"--calculate-per-token-loss is token-mean; --loss-agg {args.loss_agg} contradicts it"
    if args.min_lr > args.lr:
        yield f"--min-lr ({args.min_lr}) must not exceed --lr ({args.lr})"

    if args.target_modules != "all-linear":
        modules = _split(args.target_modules)
        if not modules:
            yield '--target-modules must be "all-linear" or a comma list of module names'
        elif "all-linear" in modules:
            yield '--target-modules: "all-linear" cannot be combined with module names'

    if args.eval_prompt_data is not None:
        pairs = args.eval_prompt_data
        if len(pairs) % 2:
            yield (
                f"--eval-prompt-data takes NAME PATH pairs (got {len(pairs)} values: "
                f"{' '.join(pairs)})"
            )
        elif len(args.eval_datasets) != len(pairs) // 2:
            yield "--eval-prompt-data names must be unique"
    if args.eval_interval is not None and not args.eval_prompt_data:
        yield "--eval-interval needs --eval-prompt-data"
    if args.save_interval is not None and not args.save:
        yield "--save-interval needs --save"

    samples = args.rollout_batch_size * args.n_samples_per_prompt
    if samples % args.global_batch_size:
        yield (
            f"samples per rollout (--rollout-batch-size {args.rollout_batch_size} x "
            f"--n-samples-per-prompt {args.n_samples_per_prompt} = {samples}) must be a multiple "
            f"of --global-batch-size {args.global_batch_size}"
        )

    actor_gpus = actor_num_gpus(args)
    if args.actor_num_gpus_per_node > args.num_gpus_per_node:
        yield (
            f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node} exceeds "
            f"--num-gpus-per-node {args.num_gpus_per_node}"
        )
    if actor_gpus % args.rollout_num_gpus_per_engine:
        yield (
            f"actor GPUs ({args.actor_num_nodes} node(s) x {args.actor_num_gpus_per_node} = "
            f"{actor_gpus}) must be divisible by --rollout-num-gpus-per-engine "
            f"{args.rollout_num_gpus_per_engine}"
        )
    if args.rollout_num_gpus % args.rollout_num_gpus_per_engine:
        yield (
            f"--rollout-num-gpus {args.rollout_num_gpus} must be divisible by "
            f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine}"
        )
    if args.colocate and args.rollout_num_gpus != actor_gpus:
        yield (
            f"--colocate shares the actor's {actor_gpus} GPU(s); "
            f"--rollout-num-gpus {args.rollout_num_gpus} differs"
        )

    parallel = {
        "--tensor-model-parallel-size": args.tensor_model_parallel_size,
        "--pipeline-model-parallel-size": args.pipeline_model_parallel_size,
        "--context-parallel-size": args.context_parallel_size,
        "--expert-model-parallel-size": args.expert_model_parallel_size,
    }
    if args.train_backend != "megatron":
        for flag, size in parallel.items():
            if size > 1:
                yield f"{flag} {size} needs --train-backend megatron"
    model_parallel = (
        args.tensor_model_parallel_size
        * args.pipeline_model_parallel_size
        * args.context_parallel_size
    )
    if actor_gpus % model_parallel:
        yield (f"actor GPUs ({actor_gpus}) must be divisible by TP x PP x CP ({model_parallel})")
    else:
        dp = data_parallel_size(args)
        if args.global_batch_size % dp:
            yield (
                f"--global-batch-size {args.global_batch_size} must be divisible by the "
                f"data-parallel size {dp}"
            )
        elif not args.use_dynamic_batch_size and (args.global_batch_size // dp) % (
            args.micro_batch_size
        ):
            yield (
                f"per-rank batch ({args.global_batch_size} / {dp} data-parallel ranks = "
                f"{args.global_batch_size // dp}) must be divisible by --micro-batch-size "
                f"{args.micro_batch_size}"
            )
    if args.sequence_parallel and args.tensor_model_parallel_size == 1:
        yield "--sequence-parallel needs --tensor-model-parallel-size > 1"
    if args.use_dynamic_batch_size and args.max_tokens_per_gpu is None:
        yield "--use-dynamic-batch-size needs --max-tokens-per-gpu"
    if args.recompute_method is not None and args.recompute_granularity != "full":
        yield "--recompute-method needs --recompute-granularity full"
    if args.recompute_num_layers is not None and args.recompute_method is None:
        yield "--recompute-num-layers needs --recompute-method"
    if args.recompute_granularity == "full" and None in (
        args.recompute_method,
        args.recompute_num_layers,
    ):
        yield "--recompute-granularity full needs --recompute-method and --recompute-num-layers"

    if args.device == "cpu" and (
        args.train_backend == "megatron" or args.rollout_backend == "sglang"
    ):
        yield "--device cpu works only with --train-backend torch and --rollout-backend hf"
    if args.rollout_backend != "sglang":
        declared = {
            "--sglang-mem-fraction-static": args.sglang_mem_fraction_static,
            "--sglang-chunked-prefill-size": args.sglang_chunked_prefill_size,
            "--sglang-lora-backend": args.sglang_lora_backend,
            "--sglang-attention-backend": args.sglang_attention_backend,
        }
        given = [flag for flag, value in declared.items() if value is not None]
        given += [SGLANG_PREFIX + key for key in sorted(args.sglang_extra)]
        if given:
            yield f"{given[0]} needs --rollout-backend sglang"
    elif args.sglang_extra:
        from trainer.backends.sglang_args import SGLangArgError, coerce_extra

        try:
            coerce_extra(args.sglang_extra)
        except SGLangArgError as err:
            yield str(err)
