"""Prompt data sets (JSONL or Parquet) and the resumable cursor that walks them.

A row holds a prompt under ``--input-key`` (a string, or a list of chat messages) and a label
under ``--label-key``. With ``--apply-chat-template`` the prompt goes through the tokenizer's own
chat template (a plain string becomes one user message); without it the prompt string is used as
is. `RolloutDataSource.next_batch` walks the prompts epoch after epoch, each epoch in an order
fixed by (seed, epoch), so a cursor (epoch, offset) saved in a checkpoint resumes exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainer.config import DataConfig, RolloutConfig, TrainConfig
from trainer.errors import UsageError


class DataError(UsageError):
    """A prompt file that cannot be used as asked (one line; names the file and row)."""


class Tokenizer(Protocol):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...


@dataclass(frozen=True)
class Sample:
    """One prompt: `index` is its row in the file (0-based), `prompt` the text to generate from."""

    index: int
    prompt: str
    label: Any
    metadata: dict[str, Any] = field(default_factory=dict)


def read_rows(path: str | Path) -> list[tuple[str, dict[str, Any]]]:
    """(location, row) pairs; the location (``file:line`` or ``file:row N``) is for messages."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prompt data not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several types for unreadable files
            raise DataError(f"{path}: not a readable Parquet file ({err})") from None
        return [(f"{path}:row {i + 1}", row) for i, row in enumerate(rows)]
    if path.suffix not in (".jsonl", ".json"):
        raise DataError(f"{path}: prompt data must be .jsonl, .json (JSON lines) or .parquet")
    rows = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                byte = raw[err.start]
                raise DataError(
                    f"{where}: not UTF-8 (byte 0x{byte:02x} at column {err.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: invalid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: each line must be a JSON object")
            rows.append((where, row))
    return rows


def render_prompt(
    value: Any,
    *,
    tokenizer: Tokenizer | None,
    apply_chat_template: bool,
    where: str,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    if isinstance(value, list):
        if not apply_chat_template:
            raise DataError(
                f"{where}: the prompt is a chat message list; pass --apply-chat-template"
            )
        if not value or not all(
            isinstance(m, dict) and {"role", "content"} <= m.keys() for m in value
        ):
            raise DataError(f"{where}: chat messages must be objects with 'role' and 'content'")
        messages = value
    elif isinstance(value, str):
        if not apply_chat_template:
            return value
        messages = [{"role": "user", "content": value}]
    else:
        raise DataError(f"{where}: the prompt must be a string or a list of chat messages")
    if tokenizer is None:
        raise ValueError("--apply-chat-template needs a tokenizer")
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
        )
    except TemplateError as err:
        raise DataError(f"{where}: the chat template fails on this row ({err.message})") from None


def load_prompts(
    path: str | Path,
    *,
    input_key: str = "prompt",
    label_key: str = "label",
    tokenizer: Tokenizer | None = None,
    apply_chat_template: bool = False,
    max_prompt_len: int | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[Sample]:
    """Every usable prompt of a file; prompts longer than `max_prompt_len` tokens are dropped."""
    if max_prompt_len is not None and tokenizer is None:
        raise ValueError("max_prompt_len needs a tokenizer")
    samples = []
    for index, (where, row) in enumerate(read_rows(path)):
        for key in (input_key, label_key):
            if key not in row:
                keys = ", ".join(sorted(row)) or "none"
                raise DataError(f"{where}: missing key {key!r} (row has: {keys})")
        prompt = render_prompt(
            row[input_key],
            tokenizer=tokenizer,
            apply_chat_template=apply_chat_template,
            where=where,
            template_kwargs=template_kwargs,
        )
        if (
            max_prompt_len is not None
            and len(tokenizer.encode(prompt, add_special_tokens=False)) > max_prompt_len
        ):
            continue
        metadata = {k: v for k, v in row.items() if k not in (input_key, label_key)}
        samples.append(Sample(index, prompt, row[label_key], metadata))
    if not samples:
        limit = f" of at most {max_prompt_len} tokens" if max_prompt_len is not None else ""
        raise DataError(f"{path}: no prompts{limit}")
    return samples


@dataclass
class DataCursor:
    """Position in the prompt stream: `offset` prompts of epoch `epoch` are consumed."""

    epoch: int = 0
    offset: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


class RolloutDataSource:
    def __init__(self, samples: Sequence[Sample], *, shuffle: bool = False, seed: int = 0) -> None:
        if not samples:
            raise ValueError("RolloutDataSource needs at least one sample")
        self.samples = list(samples)
        self.shuffle = shuffle
        self.seed = seed
        self.cursor = DataCursor()

    def __len__(self) -> int:
        return len(self.samples)

    def order(self, epoch: int) -> list[int]:
        """The visiting order of an epoch: fixed by (seed, epoch), identical across runs."""
        order = list(range(len(self.samples)))
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Sample]:
        """The next `n` prompts, continuing into the next epoch when this one runs out."""
        batch: list[Sample] = []
        while len(batch) < n:
            order = self.order(self.cursor.epoch)
            take = order[self.cursor.offset : self.cursor.offset + n - len(batch)]
            batch.extend(self.samples[i] for i in take)
            self.cursor.offset += len(take)
            if self.cursor.offset == len(order):
                self.cursor.epoch += 1
                self.cursor.offset = 0
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.cursor.state_dict(),
            "num_prompts": len(self.samples),
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def cursor_problem(self, state: Any) -> str | None:
        """Why `state` (what `state_dict` returned, read back from a checkpoint) is no cursor
        of these prompts, or None: its keys and types, the prompt set and its order (count,
        shuffle, seed), and the offset within an epoch."""
        types = {"epoch": int, "offset": int, "num_prompts": int, "shuffle": bool, "seed": int}
        if not isinstance(state, dict):
            return "the data cursor is not a JSON object"
        for key, kind in types.items():
            value = state.get(key)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                return f"the data cursor's {key!r} is {value!r}, not {_a(kind)}"
        saved = (state["num_prompts"], state["shuffle"], state["seed"])
        if saved != (len(self.samples), self.shuffle, self.seed):
            return (
                f"the data cursor was taken on {saved[0]} prompts (shuffle={saved[1]}, "
                f"seed={saved[2]}); this run has {len(self.samples)} (shuffle={self.shuffle}, "
                f"seed={self.seed})"
            )
        if state["epoch"] < 0 or not 0 <= state["offset"] < len(self.samples):
            return (
                f"the data cursor (epoch {state['epoch']}, offset {state['offset']}) is not a "
                f"position in {len(self.samples)} prompts"
            )
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (problem := self.cursor_problem(state)) is not None:
            raise DataError(problem)
        self.cursor.load_state_dict(state)


def _a(kind: type) -> str:
    return {int: "an integer", bool: "true or false"}[kind]


def num_rollouts_for_epochs(num_prompts: int, rollout_batch_size: int, num_epoch: int) -> int:
    """Rollouts that consume `num_epoch` epochs (at least one)."""
    return max(1, num_epoch * num_prompts // rollout_batch_size)


def num_rollouts(rollout: RolloutConfig, num_prompts: int) -> int:
    """``--num-rollout``, or the rollouts of ``--num-epoch`` epochs of `num_prompts` prompts."""
    if rollout.num_rollout is not None:
        return rollout.num_rollout
    return num_rollouts_for_epochs(num_prompts, rollout.rollout_batch_size, rollout.num_epoch)


def load_prompt_set(path: str, data: DataConfig, tokenizer: Tokenizer | None) -> list[Sample]:
    """A prompt file (the training set or an eval set) read as the data flags say."""
    return load_prompts(
        path,
        input_key=data.input_key,
        label_key=data.label_key,
        tokenizer=tokenizer,
        apply_chat_template=data.apply_chat_template,
        max_prompt_len=data.rollout_max_prompt_len,
        template_kwargs=data.apply_chat_template_kwargs,
    )


def rollout_source(config: TrainConfig, tokenizer: Tokenizer | None) -> RolloutDataSource:
    """The training prompts (``--prompt-data``), walked as ``--rollout-shuffle`` says."""
    data = config.data
    samples = load_prompt_set(data.prompt_data, data, tokenizer)
    return RolloutDataSource(samples, shuffle=data.rollout_shuffle, seed=config.misc.seed)


def eval_sets(config: TrainConfig, tokenizer: Tokenizer | None) -> dict[str, list[Sample]]:
    """``--eval-prompt-data`` sets by name, read like the training prompts."""
    return {
        name: load_prompt_set(path, config.data, tokenizer)
        for name, path in config.eval.eval_datasets.items()
    }
