"""A saved adapter's own proof: the trainer's log-probs of one fixed sequence, kept beside it.

With ``--check-adapter-sync`` every checkpoint's ``adapter/`` holds ``logprob_check.json``: the
sync check's sequence (the first rollout's first sample, prompt and response), its response
tokens, the rollout temperature, and the log-probs the trainer computed for those tokens with
this adapter. Whoever loads the adapter elsewhere (PEFT + transformers, an inference engine)
can check it reproduces the trainer's policy:

    python -m trainer.run.adapter_check <checkpoint>/adapter [--device cuda] [--dtype bf16]

prints the mean |difference| over the response tokens next to how far the adapter moves them
(with it disabled), and exits 1 when the difference is not below ``--tolerance``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import owned_files

CHECK_FILE = "logprob_check.json"


@dataclass(frozen=True)
class LogprobCheck:
    input_ids: list[int]
    response: list[bool]  # per position of input_ids[1:]: whether that token is scored
    logprobs: list[float]  # the trainer's, one per scored token
    temperature: float


def write(adapter_dir: Path, check: LogprobCheck) -> None:
    owned_files.write_atomic(adapter_dir / CHECK_FILE, json.dumps(check.__dict__) + "\n")


def read(adapter_dir: Path) -> LogprobCheck:
    return LogprobCheck(**json.loads((adapter_dir / CHECK_FILE).read_text(encoding="utf-8")))


def peft_logprobs(
    adapter_dir: Path, check: LogprobCheck, *, device: str = "cpu", dtype: str = "fp32"
) -> tuple[list[float], list[float]]:
    """The check's scored tokens' log-probs from the base model + this adapter through PEFT and
    transformers, with the adapter and without it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = json.loads((adapter_dir / "adapter_config.json").read_text(encoding="utf-8"))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    base_dir = config["base_model_name_or_path"]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch_dtype)
    model = PeftModel.from_pretrained(base, adapter_dir).to(device).eval()
    ids = torch.tensor([check.input_ids], device=device)
    scored = torch.tensor(check.response, device=device)

    def scores() -> list[float]:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float() / check.temperature
        picked = logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        return picked[scored].tolist()

    with_adapter = scores()
    with model.disable_adapter():
        without = scores()
    return with_adapter, without


def mean_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / max(len(a), 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.run.adapter_check", description=__doc__.splitlines()[0]
    )
    parser.add_argument("adapter_dir", type=Path, help="a checkpoint's adapter/ folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args(argv)
    if not (args.adapter_dir / CHECK_FILE).is_file():
        parser.exit(2, f"{parser.prog}: error: no {CHECK_FILE} in {args.adapter_dir} (trained "
                    "without --check-adapter-sync?)\n")  # fmt: skip
    check = read(args.adapter_dir)
    with_adapter, without = peft_logprobs(
        args.adapter_dir, check, device=args.device, dtype=args.dtype
    )
    report: dict[str, Any] = {
        "tokens": len(check.logprobs),
        "peft_vs_trainer": mean_abs_diff(with_adapter, check.logprobs),
        "adapter_shift": mean_abs_diff(with_adapter, without),
    }
    print(json.dumps(report, sort_keys=True))
    return 0 if report["peft_vs_trainer"] < args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
