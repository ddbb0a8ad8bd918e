"""Rule-based rewards, chosen by ``--rm-type``.

A reward is ``fn(response: str, label) -> float``: `response` is the generated text only (no
prompt), `label` the data set's label (a string, a number, or a list of acceptable answers).
`register_reward` adds one; an entry of `_LAZY` (``name -> "module:function"``) is imported on
first use, so this module stays light (``trainer.config`` imports it for the ``--rm-type``
choices); the imported module may instead register the name itself.

``deepscaler`` and ``math`` grade as miles' ``rm_hub`` does (`trainer.grpo.grading`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

RewardFn = Callable[[str, Any], float]

_REGISTRY: dict[str, RewardFn] = {}
_LAZY: dict[str, str] = {
    "deepscaler": "trainer.grpo.grading:deepscaler_reward",
    "math": "trainer.grpo.grading:math_reward",
    "tiny": "trainer.tiny:tiny_reward",
}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    def decorate(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return decorate


def reward_names() -> list[str]:
    return sorted({*_REGISTRY, *_LAZY})


def get_reward(name: str) -> RewardFn:
    if name not in _REGISTRY and name in _LAZY:
        module, attr = _LAZY[name].split(":")
        loaded = importlib.import_module(module)  # may register `name` itself
        if name not in _REGISTRY:
            _REGISTRY[name] = getattr(loaded, attr)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown reward {name!r}; known: {', '.join(reward_names())}") from None


@dataclass
class RewardSample:
    """What a ``--custom-rm-path`` function (miles' signature ``fn(args, sample)``) and a
    dynamic-sampling filter read; `reward` is set once graded."""

    prompt: str
    response: str
    label: Any
    metadata: dict[str, Any] = field(default_factory=dict)
    reward: Any = None

    def get_reward_value(self, args: Any) -> Any:
        """miles' ``Sample.get_reward_value``, which miles-written filters call."""
        return self.reward


def load_function(path: str) -> Callable[..., Any]:
    """``module.function`` (as miles' ``load_function``) imported; bad paths raise ValueError."""
    module, _, name = path.rpartition(".")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import {path}: {err}") from None
    if not callable(function):
        raise ValueError(f"{path} is not callable")
    return function


def call_custom_rewards(
    function: Callable[..., Any], args: argparse.Namespace, samples: Sequence[RewardSample]
) -> list[Any]:
    """``function(args, sample)`` for every sample; coroutines (miles allows an async reward,
    usually a reward-server client) are awaited together, on one event loop."""
    results = [function(args, sample) for sample in samples]
    pending = [i for i, result in enumerate(results) if inspect.isawaitable(result)]
    if pending:

        async def together() -> list[Any]:
            return await asyncio.gather(*(results[i] for i in pending))

        for i, value in zip(pending, asyncio.run(together()), strict=True):
            results[i] = value
    return results


def reward_value(value: Any, reward_key: str | None) -> float:
    """A reward as a float; a dict reward is read under ``--reward-key`` (as miles)."""
    if isinstance(value, dict):
        if reward_key is None or reward_key not in value:
            keys = ", ".join(sorted(map(str, value)))
            raise ValueError(f"the reward is a dict (keys: {keys}); --reward-key names which one")
        value = value[reward_key]
    return float(value)


def strip_thinking(response: str) -> str | None:
    """Text after the last ``</think>``; None when a ``<think>`` block is never closed."""
    if "</think>" in response:
        return response.rsplit("</think>", 1)[1]
    if "<think>" in response:
        return None
    return response


@register_reward("exact_match")
def exact_match_reward(response: str, label: Any) -> float:
    """1 when the answer (after any thinking block) equals the label, whitespace-trimmed."""
    answer = strip_thinking(response)
    return 1.0 if answer is not None and answer.strip() == str(label).strip() else 0.0


@register_reward("prefix_match")
def prefix_match_reward(response: str, label: Any) -> float:
    """1 when the answer starts with the label (the model may keep generating after it)."""
    answer = strip_thinking(response)
    target = str(label).strip()
    return 1.0 if answer is not None and target and answer.lstrip().startswith(target) else 0.0
