"""Prompts that do not fit the model's context with their response window, found before launch.

A prompt of P tokens generates up to ``--rollout-max-response-len`` R more; past the model's
``max_position_embeddings`` (its ``config.json``) its positions have no trained embedding, and
the rollout runs on at many times the step time on what the model never learned to read. Only
the prompts the data flags keep count (``--rollout-max-prompt-len`` drops longer ones first);
each is measured as the loop tokenizes it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from trainer.run.data import Sample


class Tokenizer(Protocol):
    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


def model_context(model_dir: Path) -> int | None:
    """``max_position_embeddings`` of the model's ``config.json`` (of its text model for a
    multimodal one), or None when it does not say."""
    if not (model_dir / "config.json").is_file():
        return None
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config)
    limit = config.get("max_position_embeddings")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def overlong_problem(
    samples: Sequence[Sample],
    tokenizer: Tokenizer,
    *,
    response_len: int,
    limit: int,
    where: str,
    response_flag: str,
) -> str | None:
    """How many of `samples` exceed `limit` tokens with a `response_len`-token response, and
    what to change; None when all fit."""
    lengths = [len(tokenizer.encode(s.prompt, add_special_tokens=False)) for s in samples]
    over = [n for n in lengths if n + response_len > limit]
    if not over:
        return None
    fits = limit - response_len
    drop = f"drop them with --rollout-max-prompt-len {fits}, or " if fits > 0 else ""
    return (
        f"{where}: {len(over)} of {len(samples)} prompts do not fit the model's context: the "
        f"longest is {max(over)} tokens + {response_flag} {response_len} = "
        f"{max(over) + response_len} > {limit} (max_position_embeddings); {drop}lower "
        f"{response_flag}"
    )
