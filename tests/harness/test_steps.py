"""Step rendering: canonical shell text, quoting, one flag per line, redaction."""

from __future__ import annotations

import json
import shlex

import pytest

from common.secrets import REDACTED
from harness.steps import (
    ClaimRun,
    HubDownload,
    RayJobSubmit,
    RayStart,
    RayStop,
    Shell,
    train_py_argv,
)


def words(text: str) -> list[str]:
    """What a POSIX shell would split the rendered text into."""
    return shlex.split(text.replace("\\\n", ""))


def test_hub_download_renders_hf_cli_with_quoted_paths():
    step = HubDownload(
        "zhuzilin/dapo-math-17k", "/data sets/dapo", "dataset", allow_patterns=("*.jsonl", "a b")
    )
    assert step.render() == (
        "hf download zhuzilin/dapo-math-17k \\\n"
        "  --repo-type dataset \\\n"
        "  --local-dir '/data sets/dapo' \\\n"
        "  --include '*.jsonl' \\\n"
        "  --include 'a b'"
    )
    assert words(step.render()) == list(step.commands()[0].argv)


def test_hub_download_rejects_unknown_repo_type():
    with pytest.raises(ValueError, match="repo_type"):
        HubDownload("a/b", "/x", "space")  # type: ignore[arg-type]


TAG = "launchers.amd.run_x@2,5/r1"


def test_run_steps_act_on_their_run_tag_only():
    assert RayStop(TAG, "/c").render() == (
        "cd /c && \\\npython3 -m harness.ownership release \\\n  --tag launchers.amd.run_x@2,5/r1"
    )
    claim = ClaimRun(TAG, "/c", ports=(6379, 8265)).render()
    assert words(claim) == [
        *("cd", "/c", "&&", "python3", "-m", "harness.ownership", "claim", "--tag", TAG),
        *("--port", "6379", "--port", "8265"),
    ]
    for text in (claim, RayStop(TAG, "/c").render()):
        assert "pkill" not in text and "ray stop" not in text
    with pytest.raises(ValueError, match="not a run tag"):
        RayStop("no-tag", "/c")


def test_a_tagged_ray_start_has_its_own_temp_dir_and_carries_the_tag():
    token = "/tmp/t/auth_token"
    (command,) = RayStart("127.0.0.1", num_gpus=2, tag=TAG, token_path=token).commands()
    temp_dir = command.argv[command.argv.index("--temp-dir") + 1]
    assert command.env == {
        "GRPO_RUN_TAG": TAG,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": token,
    }
    assert temp_dir.startswith("/tmp/grpo-") and len(temp_dir) <= 30
    other_run = RayStart("127.0.0.1", num_gpus=2, tag=TAG.replace("r1", "r2")).commands()[0]
    other_temp_dir = other_run.argv[other_run.argv.index("--temp-dir") + 1]
    assert other_temp_dir != temp_dir and other_temp_dir[:19] == temp_dir[:19]  # same slot


def test_ray_start_head_puts_env_first_and_one_flag_per_line():
    step = RayStart("10.0.0.1", num_gpus=8, num_cpus=16, env={"B": "2", "A": "x y"})
    assert step.render() == (
        "A='x y' \\\n"
        "B=2 \\\n"
        "ray start \\\n"
        "  --head \\\n"
        "  --node-ip-address 10.0.0.1 \\\n"
        "  --port 6379 \\\n"
        "  --num-gpus 8 \\\n"
        "  --num-cpus 16 \\\n"
        "  --dashboard-host 127.0.0.1 \\\n"
        "  --dashboard-port 8265 \\\n"
        "  --disable-usage-stats"
    )


def test_ray_start_worker_joins_the_head():
    step = RayStart("10.0.0.2", num_gpus=8, head=False, head_address="10.0.0.1:6379")
    assert words(step.render()) == [
        "ray", "start", "--address", "10.0.0.1:6379", "--node-ip-address", "10.0.0.2",
        "--num-gpus", "8", "--disable-usage-stats",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        RayStart("10.0.0.2", num_gpus=8, head=False)
    with pytest.raises(ValueError):
        RayStart("10.0.0.1", num_gpus=8, head_address="10.0.0.9:6379")


def test_job_submit_renders_compact_sorted_runtime_env_and_redacts_secrets():
    step = RayJobSubmit(
        "http://127.0.0.1:8265",
        ["python3", "train.py", "--lr", "-1e-05", "--eval-prompt-data", "aime", "/d/a b.jsonl"],
        {
            "working_dir": "/co de",
            "env_vars": {"WANDB_API_KEY": "sk-real", "HF_TOKEN": "hf_real", "B": "1", "A": "2"},
        },
    )
    text = step.render()
    assert "sk-real" not in text and "hf_real" not in text
    argv = words(text)
    runtime_env = json.loads(argv[argv.index("--runtime-env-json") + 1])
    assert runtime_env == {
        "env_vars": {"A": "2", "B": "1", "HF_TOKEN": REDACTED, "WANDB_API_KEY": REDACTED},
        "working_dir": "/co de",
    }
    assert (
        '\'{"env_vars":{"A":"2","B":"1","HF_TOKEN":"<redacted>","WANDB_API_KEY":"<redacted>"},'
        '"working_dir":"/co de"}\'' in text
    )
    assert text.splitlines()[3:] == [
        "  -- python3 train.py \\",
        "  --lr -1e-05 \\",
        "  --eval-prompt-data aime '/d/a b.jsonl'",
    ]
    assert step.env_vars["WANDB_API_KEY"] == "sk-real", "the live step keeps the real value"


def test_a_jobs_secret_file_renders_as_a_private_write_with_redacted_values():
    token = "/tmp/grpo-1-2/auth_token"
    step = RayJobSubmit(
        "http://127.0.0.1:8265",
        ("python3", "train.py"),
        {"env_vars": {"GRPO_JOB_ENV_FILE": "/tmp/grpo-1-2/job_env"}},
        token,
        {"WANDB_API_KEY": "sk-real", "HF_TOKEN": "hf_real"},
        "/c/launchers/x.py@cpu/r",
    )
    assert step.env_file == "/tmp/grpo-1-2/job_env"
    lines = step.render().splitlines()
    assert lines[:3] == [
        "(umask 077 && cat > /tmp/grpo-1-2/job_env) <<'EOF'",
        '{"HF_TOKEN":"<redacted>","WANDB_API_KEY":"<redacted>"}',
        "EOF",
    ]
    assert "sk-real" not in str(step.to_dict()) and "hf_real" not in "\n".join(lines)
    assert step.secrets == {
        "GRPO_JOB_ENV_FILE": "/tmp/grpo-1-2/job_env",
        "WANDB_API_KEY": "sk-real",
        "HF_TOKEN": "hf_real",
    }
    with pytest.raises(ValueError, match="secret_env needs the private dir"):
        RayJobSubmit("http://h:8265", ("python3", "train.py"), secret_env={"HF_TOKEN": "x"})
    with pytest.raises(ValueError, match="token goes only to the Ray of run `tag`"):
        RayJobSubmit("http://h:8265", ("python3", "train.py"), auth_token_path=token)


def test_to_dict_is_structured_and_redacted():
    step = Shell(["python3", "-c", "pass"], cwd="/w", env={"MY_SECRET": "s3", "X": "1"})
    assert step.to_dict() == {
        "kind": "shell",
        "argv": ("python3", "-c", "pass"),
        "cwd": "/w",
        "env": {"MY_SECRET": REDACTED, "X": "1"},
    }
    assert step.env["MY_SECRET"] == "s3"


def test_shell_renders_cwd_and_env_as_valid_shell():
    step = Shell(
        ("python3", "-m", "trainer.tiny", "--model-dir", "/m m"), cwd="/c o", env={"K": "v"}
    )
    assert step.render() == (
        "cd '/c o' && \\\nK=v \\\npython3 -m trainer.tiny \\\n  --model-dir '/m m'"
    )
    assert words(step.render()) == ["cd", "/c o", "&&", "K=v", *step.argv]


def test_steps_are_immutable_values():
    step = Shell(["echo", "hi"])
    assert step.argv == ("echo", "hi")
    assert step == Shell(("echo", "hi"))
    with pytest.raises(AttributeError):
        step.argv = ("no",)  # type: ignore[misc]
    with pytest.raises(ValueError):
        Shell(())
    with pytest.raises(ValueError):
        RayJobSubmit("http://x:8265", ())


def test_train_py_argv_finds_the_trainer_in_jobs_and_shells():
    job = RayJobSubmit("http://h:8265", ("python3", "train.py", "--lr", "1"))
    assert train_py_argv(job) == ("--lr", "1")
    assert train_py_argv(Shell(("python", "train.py"))) == ()
    assert train_py_argv(Shell(("python3", "-m", "trainer.tiny"))) is None
    assert train_py_argv(RayStop(TAG, "/c")) is None
