"""Which environment variables are secrets, and how recordings hide them."""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(r"(^HF_TOKEN$|_API_KEY$|_TOKEN$|_SECRET$|_PASSWORD$)")
_MIN_SCRUB_LENGTH = 4


def is_secret(name: str) -> bool:
    """True for names such as WANDB_API_KEY, HF_TOKEN, AWS_SECRET, DB_PASSWORD."""
    return bool(_SECRET_NAME.search(name.upper()))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: REDACTED if is_secret(name) else value for name, value in env.items()}


def scrub(text: str, env: Mapping[str, str]) -> str:
    """Replace every secret value of `env` that occurs in `text` (say, pasted into an option)."""
    for name, value in env.items():
        if is_secret(name) and len(value) >= _MIN_SCRUB_LENGTH:
            text = text.replace(value, REDACTED)
    return text
