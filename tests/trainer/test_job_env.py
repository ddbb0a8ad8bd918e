"""The job's secrets arrive in a private file, not in Ray's runtime env: `trainer.job_env`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from trainer import job_env
from trainer.job.main import main as train_main

BASE = ["--hf-checkpoint", "/models/tiny", "--prompt-data", "/data/train.jsonl"]


@pytest.fixture
def restored_environ() -> Iterator[None]:
    """os.environ as it was, after a test whose code under test adds variables to it."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_train_py_reads_the_jobs_secrets_before_its_arguments(
    tmp_path, monkeypatch, capsys, restored_environ
):
    """WANDB_API_KEY from the file turns wandb online, as it would from the environment."""
    env_file = tmp_path / "job_env"
    env_file.write_text(json.dumps({"WANDB_API_KEY": "k-from-file", "HF_TOKEN": "hf_x"}))
    for name in ("WANDB_API_KEY", "HF_TOKEN"):
        os.environ.pop(name, None)
    monkeypatch.setenv(job_env.ENV_FILE_VAR, str(env_file))
    assert train_main([*BASE, "--validate-only"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["wandb_mode"] == "online" and "k-from-file" not in out
    assert os.environ["HF_TOKEN"] == "hf_x"


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "No such file or directory"), ("not json", "not a JSON object of variables"),
     ('["A=1"]', "not a JSON object of variables"), ('{"A": 1}', "not a JSON object of variables")],
)  # fmt: skip
def test_an_unreadable_env_file_is_one_line(content, reason, tmp_path, monkeypatch, capsys):
    env_file = tmp_path / "job_env"
    if content is not None:
        env_file.write_text(content)
    monkeypatch.setenv(job_env.ENV_FILE_VAR, str(env_file))
    assert train_main([*BASE, "--validate-only"]) == 1
    err = capsys.readouterr().err
    assert err == f"train.py: error: {job_env.ENV_FILE_VAR}={env_file}: {reason}\n"


def test_without_the_variable_nothing_is_read(monkeypatch):
    monkeypatch.delenv(job_env.ENV_FILE_VAR, raising=False)
    before = dict(os.environ)
    job_env.load()
    assert dict(os.environ) == before
