"""Which names are secrets, and how recordings, dry runs, the console and the trainer hide them.

A name is a secret when it says so: it contains SECRET, PASSWORD, PASSWD, CREDENTIAL or
PRIVATE_KEY, or ends in TOKEN, KEY, PASS or PAT (``WANDB_API_KEY``, ``HF_TOKEN``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``DB_PASS``, ``GITHUB_PAT``). Names that end in
a pointer to a secret (``RAY_AUTH_TOKEN_PATH``, ``..._KEY_FILE``, ``..._KEY_ID``) are not. Case
and ``-`` / ``_`` do not matter: the trainer's ``--sglang-api-key`` is one (the one pattern of
the project: environment variables and flag names alike). Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
_SECRET_NAME = re.compile(
    r"SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_?KEY|(^|_)(TOKEN|KEY|PASS|PAT)$"
)
_MIN_SCRUB_LENGTH = 4


def is_secret(name: str) -> bool:
    """True for names such as WANDB_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY, api-key."""
    return bool(_SECRET_NAME.search(name.upper().replace("-", "_")))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {name: REDACTED if is_secret(name) else value for name, value in env.items()}


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of `env`'s secrets long enough to scrub, longest first."""
    values = {v for name, v in env.items() if is_secret(name) and len(v) >= _MIN_SCRUB_LENGTH}
    return sorted(values, key=len, reverse=True)


def secrets_in(text: str, env: Mapping[str, str]) -> list[str]:
    """The names of `env`'s secrets whose values occur in `text`."""
    values = set(secret_values(env))
    return [name for name, value in env.items() if value in values and value in text]


def scrub(text: str, env: Mapping[str, str]) -> str:
    """Replace every secret value of `env` that occurs in `text` (say, pasted into an option)."""
    for value in secret_values(env):
        text = text.replace(value, REDACTED)
    return text


def scrub_data(data: Any, env: Mapping[str, str]) -> Any:
    """`scrub` applied to every string inside nested lists, tuples and dicts."""
    if isinstance(data, str):
        return scrub(data, env)
    if isinstance(data, dict):
        return {key: scrub_data(value, env) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(scrub_data(value, env) for value in data)
    return data
