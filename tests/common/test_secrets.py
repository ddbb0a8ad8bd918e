"""Which names are secrets, and how their values are scrubbed from text and data."""

from __future__ import annotations

import pytest

from common.secrets import REDACTED, is_secret, scrub, scrub_data


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("WANDB_API_KEY", True),
        ("HF_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET", True),
        ("DB_PASSWORD", True),
        ("wandb_api_key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_SESSION_TOKEN", True),
        ("MY_CLIENT_SECRET_VALUE", True),
        ("SMTP_PASS", True),
        ("PGPASSWORD", True),
        ("GITHUB_PAT", True),
        ("SSH_PRIVATE_KEY", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("RAY_AUTH_TOKEN", True),
        ("TOKEN", True),
        ("WANDB_PROJECT", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("HIP_VISIBLE_DEVICES", False),
        ("RAY_AUTH_TOKEN_PATH", False),
        ("AWS_ACCESS_KEY_ID", False),
        ("PWD", False),
        ("PASSAGE_COUNT", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret(name) is secret


def test_scrub_removes_secret_values_anywhere_in_text():
    env = {"WANDB_API_KEY": "abcd1234", "HOME": "/root", "HF_TOKEN": "xy"}
    assert scrub("--x abcd1234 /root xy", env) == f"--x {REDACTED} /root xy"
    env = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-long", "DB_PASS": "s3cr3t"}
    assert scrub("a=s3cr3t-long b=s3cr3t", env) == f"a={REDACTED} b={REDACTED}"
    nested = {"argv": ("--k", "s3cr3t"), "env": [{"X": "s3cr3t!"}], "n": 1}
    assert scrub_data(nested, env) == {
        "argv": ("--k", REDACTED),
        "env": [{"X": f"{REDACTED}!"}],
        "n": 1,
    }
