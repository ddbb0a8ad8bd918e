"""The launcher command line: options, env-var overrides, --dry-run, and one-line errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from harness.cli import run
from harness.context import Plan
from harness.errors import Terminated
from harness.hardware import match_hardware
from harness.host import CHECKOUT, RECORD_RUN_ID, HostView, detect_gpus
from harness.record import record
from harness.steps import ClaimRun, RayJobSubmit, RayStart, RayStop, VerifyRay
from launchers.amd.run_qwen3_4b_lora import LAUNCHER as AMD
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from tests.support.private_ray import LauncherPorts
from trainer.config import LoraConfig
from trainer.config.flags import flag_fields

PROG = "python -m launchers.amd.run_qwen3_4b_lora"


class SpyRunner:
    """A live runner that records the plans it is given instead of running them."""

    def __init__(self, status: int = 0) -> None:
        self.plans: list[Plan] = []
        self.status = status

    def __call__(self, plan: Plan) -> int:
        self.plans.append(plan)
        return self.status


def host(detected: str | None = None, **env: str) -> Callable[[], HostView]:
    return lambda: HostView(env, "/home/u", "/repo", "/work", "run-1", lambda: detected)


def cli(launcher, argv, capsys, *, live=None, detected=None, **env):
    status = run(launcher, argv, live=live or SpyRunner(), host=host(detected, **env))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["train", "--hardware", "MI300X"], "'MI300X' is not one of 'auto', 'MI350X', 'MI355X'"),
        (["train", "--num-gpus-per-node", "0"], "--num-gpus-per-node must be >= 1 (got 0)"),
        (["train", "--set", "lora-rank=-4"], "--lora-rank must be > 0 (got -4)"),
        (["train", "--bogus"], "No such option: --bogus"),
        (["train", "--set", "global-batch-size=48"], "a multiple of --global-batch-size 48"),
        (["train", "--set", "lora.lora_rank=x"], "--lora-rank 'x': invalid int value"),
        (["train", "--set", "lr=nan"], "--lr must be a finite number (got nan)"),
        (["train", "--set", "--sglang-mem-fraction-static=inf"], "a finite number (got inf)"),
        (["worker", "--num-nodes", "2"], "worker needs --head-address"),
        (["worker", "--head-address", "h", "--ray-address", "http://h:8265"], "drop --ray-address"),
        (["train", "--extra-env", "NOPE"], "--extra-env items must be NAME=VALUE"),
        (["train", "--set", "wandb-key=k"], "train.py has no setting 'wandb-key'"),
        (["train", "--set", "actor-num-nodes=2"], "--actor-num-nodes follows from the cluster"),
        (["train", "--set", "lora-rank"], "--set 'lora-rank': give NAME=VALUE"),
        (["prepare", "--run-id", "../x"], "--run-id must be"),
        (["pretrain"], "No such command 'pretrain'"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["live", "dry-run"])
def test_bad_input_is_one_line_exit_2_and_nothing_runs(argv, reason, dry_run, capsys):
    spy = SpyRunner()
    argv = [*argv, *["--dry-run"] * dry_run]
    status, out, err = cli(AMD, argv, capsys, live=spy, detected="AMD Instinct MI355X")
    assert status == 2
    assert out == "" and spy.plans == []
    assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: ")
    assert reason in err


def test_dry_run_prints_the_host_recording_and_runs_nothing(capsys):
    spy = SpyRunner()
    status, out, err = cli(AMD, ["train", "--dry-run"], capsys, live=spy, WANDB_API_KEY="k-123")
    assert status == 0 and spy.plans == []
    assert out.startswith("# launcher: launchers/amd/run_qwen3_4b_lora.py\n# entrypoint: train\n")
    assert "--hf-checkpoint /home/u/models/Qwen3-4B" in out
    assert "--output-dir /home/u/outputs/run-1" in out
    assert err == "--hardware auto found no GPU on this host; showing MI355X, the recording's\n"


def test_dry_run_uses_the_detected_gpu_and_visible_devices(capsys):
    status, out, _ = cli(
        AMD,
        ["train", "--dry-run"],
        capsys,
        detected="AMD Instinct MI350X",
        HIP_VISIBLE_DEVICES="0,1",
    )
    assert status == 0
    assert "# hardware: MI350X" in out
    assert "CUDA_VISIBLE_DEVICES=0,1 \\\n" in out
    assert "--num-gpus 2 \\\n" in out and "--actor-num-gpus-per-node 2 \\\n" in out


def test_live_mode_hands_the_validated_plan_to_the_runner(capsys):
    spy = SpyRunner(status=3)
    status, out, _ = cli(CPU, ["train", "--run-id", "r"], capsys, live=spy)
    assert status == 3, "the runner's exit status is the launcher's"
    assert out == ""
    (plan,) = spy.plans
    assert [type(s) for s in plan.steps] == [ClaimRun, RayStart, VerifyRay, RayJobSubmit, RayStop]
    assert plan.steps[1].num_cpus == 2 and plan.steps[1].num_gpus == 0


@pytest.mark.parametrize(
    ("raised", "status", "reason"),
    [
        (KeyboardInterrupt, 130, "interrupted"),
        (Terminated, 143, "terminated"),
        (Terminated(signal.SIGHUP), 129, "hung up"),
    ],
)
def test_ctrl_c_and_sigterm_end_in_one_line(raised, status, reason, capsys):
    def live(plan: Plan) -> int:
        raise raised

    assert cli(CPU, ["train"], capsys, live=live) == (
        status,
        "",
        f"python -m launchers.cpu.run_tiny_qwen3_lora: error: {reason}\n",
    )


def test_joining_a_running_cluster_touches_no_local_process(capsys):
    spy = SpyRunner()
    argv = ["train", "--ray-address", "http://10.0.0.1:8265", "--num-nodes", "2"]
    assert cli(AMD, [*argv, "--hardware", "MI355X"], capsys, live=spy)[0] == 0
    (job,) = spy.plans[0].steps
    assert isinstance(job, RayJobSubmit) and job.address == "http://10.0.0.1:8265"
    assert job.entrypoint[job.entrypoint.index("--actor-num-nodes") + 1] == "2"


def test_a_setting_changes_what_prepare_fetches(capsys):
    no_eval = ["--set", "eval-prompt-data=", "--set", "eval-interval="]
    status, out, _ = cli(AMD, ["prepare", "--dry-run", *no_eval], capsys)
    assert status == 0
    assert "hf download Qwen/Qwen3-4B \\\n" in out and "aime" not in out


def test_options_come_from_project_env_vars(capsys, monkeypatch):
    monkeypatch.setenv("GRPO_LAUNCHER_RUN_ID", "from-env")
    status, out, _ = cli(AMD, ["train", "--dry-run", "--set", "lr=3e-05"], capsys)
    assert status == 0
    assert "--output-dir /home/u/outputs/from-env \\\n" in out and "--lr 3e-05 \\\n" in out


def test_a_bad_value_from_the_environment_names_its_variable(capsys, monkeypatch):
    monkeypatch.setenv("GRPO_LAUNCHER_NUM_NODES", "abc")
    status, _, err = cli(AMD, ["train", "--dry-run"], capsys)
    assert status == 2 and err.count("\n") == 1
    assert "GRPO_LAUNCHER_NUM_NODES='abc'" in err and "--num-nodes" in err
    status, _, err = cli(AMD, ["train", "--dry-run", "--num-nodes", "x"], capsys)
    assert status == 2 and "GRPO_LAUNCHER_NUM_NODES" not in err  # the command line gave it


def test_settings_go_in_order_and_the_last_wins(capsys):
    argv = ["train", "--dry-run", "--set", "lora-rank=16", "--set", "lora.lora_rank=32"]
    argv += ["--set", "sglang-log-level=warning", "--set", "lora-base-cpu-backup=false"]
    status, out, _ = cli(AMD, argv, capsys)
    assert status == 0
    assert "--lora-rank 32 \\\n" in out and "--sglang-log-level warning" in out
    assert "--lora-base-cpu-backup" not in out


def test_secrets_are_redacted_from_printed_recordings(capsys):
    argv = ["train", "--dry-run", "--extra-env", "HF_TOKEN=hf_pasted_1234,NCCL_DEBUG=INFO"]
    status, out, _ = cli(AMD, argv, capsys, WANDB_API_KEY="sk-live-5678", MY_TOKEN="tok-9999")
    assert status == 0
    assert "sk-live-5678" not in out and "hf_pasted_1234" not in out
    assert '"WANDB_API_KEY":"<redacted>"' in out and '"HF_TOKEN":"<redacted>"' in out
    assert '"NCCL_DEBUG":"INFO"' in out
    assert "--use-wandb" in out and "--wandb-mode online" in out


def test_secrets_reach_the_launchers_own_ray_in_a_private_file_never_in_its_runtime_env(capsys):
    """Ray logs a runtime env's variables in clear text: on a Ray of the run's own, secrets go
    to a file beside the run's token, which the runtime env names; a cluster the user gives
    (--ray-address) gets them as variables."""
    spy = SpyRunner()
    argv = ["train", "--run-id", "r", "--extra-env", "MY_TOKEN=tok-1,PLAIN=p"]
    env = {"WANDB_API_KEY": "sk-1", "HF_TOKEN": "hf_1"}
    assert cli(AMD, argv, capsys, live=spy, detected="AMD Instinct MI355X", **env)[0] == 0
    job = spy.plans[0].steps[3]
    assert isinstance(job, RayJobSubmit)
    assert job.secret_env == {"WANDB_API_KEY": "sk-1", "HF_TOKEN": "hf_1", "MY_TOKEN": "tok-1"}
    assert job.env_file == job.auth_token_path.replace("auth_token", "job_env")
    assert job.env_vars["GRPO_JOB_ENV_FILE"] == job.env_file and job.env_vars["PLAIN"] == "p"
    assert not {"WANDB_API_KEY", "HF_TOKEN", "MY_TOKEN"} & set(job.env_vars)
    assert job.runtime_env["worker_process_setup_hook"] == "trainer.job_env.load"

    spy = SpyRunner()
    argv = [*argv, "--ray-address", "http://head:8265"]
    assert cli(AMD, argv, capsys, live=spy, detected="AMD Instinct MI355X", **env)[0] == 0
    (job,) = spy.plans[0].steps
    assert job.secret_env == {} and job.env_file is None
    assert job.env_vars["HF_TOKEN"] == "hf_1" and "GRPO_JOB_ENV_FILE" not in job.env_vars


def test_the_ray_client_port_is_the_runs_choice_and_claimed(capsys):
    """Two heads on one host: Ray's client server would take 10001 for both."""
    spy = SpyRunner()
    argv = ["train", "--client-server-port", "31001"]
    assert cli(CPU, argv, capsys, live=spy)[0] == 0
    claim, start = spy.plans[0].steps[:2]
    assert isinstance(claim, ClaimRun) and 31001 in claim.ports
    (command,) = start.commands()
    assert command.argv[command.argv.index("--ray-client-server-port") + 1] == "31001"
    status, _, err = cli(CPU, ["train", "--client-server-port", "0"], capsys)
    assert status == 2 and "--client-server-port must be a TCP port (got 0)" in err


def test_common_secret_names_and_their_values_are_redacted_in_dry_runs(capsys):
    extra = "AWS_SECRET_ACCESS_KEY=aws-s3cr3t,DB_PASSWORD=pw-s3cr3t,SMTP_PASS=smtp-s3cr3t"
    argv = ["train", "--dry-run", "--extra-env", extra]
    status, out, _ = cli(AMD, argv, capsys, DB_PASSWORD="pw-s3cr3t")
    assert status == 0
    assert "s3cr3t" not in out
    for name in ("AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "SMTP_PASS"):
        assert f'"{name}":"<redacted>"' in out


@pytest.mark.parametrize(
    ("mode", "key", "flags"),
    [
        ("online", None, False),
        ("online", "k-1", True),
        ("offline", None, True),
        ("disabled", "k-1", False),
    ],
)
def test_wandb_flags_need_a_key_or_offline_mode(mode, key, flags, capsys):
    env = {"WANDB_API_KEY": key} if key else {}
    argv = ["train", "--dry-run", "--hardware", "MI355X", "--wandb-mode", mode]
    status, out, _ = cli(AMD, argv, capsys, **env)
    assert status == 0
    assert ("--use-wandb" in out) is flags
    assert ("WANDB_API_KEY" in out) is (flags and key is not None)


def test_live_mode_says_when_wandb_is_off_for_want_of_a_key(capsys):
    status, _, err = cli(AMD, ["train"], capsys, detected="AMD Instinct MI355X")
    assert status == 0
    assert err == "wandb is off: WANDB_API_KEY is not set (--wandb-mode offline logs locally)\n"


def test_help_lists_every_field_with_its_help_and_choices(capsys):
    status, out, _ = cli(AMD, ["train", "--help"], capsys)
    assert status == 0
    for text in ("<auto|MI350X|MI355X>", "--dry-run", "--set NAME=VALUE", "--pass-env"):
        assert text in out
    settings = [line.strip() for line in out[out.index("Training settings of") :].splitlines()]
    lora_rank = next(spec for field, spec in flag_fields(LoraConfig) if field.name == "lora_rank")
    assert f"--lora-rank 64: {lora_rank.help}" in settings  # with the field's own help
    assert any(line.startswith("--lora-base-cpu-backup: ") for line in settings)
    status, out, _ = cli(AMD, ["--help"], capsys)
    assert status == 0 and "full-train" in out and "GRPO_LAUNCHER_" in out


def launcher_process(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launchers.amd.run_qwen3_4b_lora", *argv],
        capture_output=True,
        text=True,
        cwd=CHECKOUT,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


HOST_SPECIFIC = re.compile(r"/__|/tmp/grpo-")  # placeholder paths; the run's temp dir


def design_values() -> list[str]:
    """The lines of the AMD train recording that hold no placeholder path, for checking that a
    dry run shows every line of the recording (the snapshot, not this, pins the seed's values)."""
    text = record(AMD, "train").text
    return [
        line.strip().removesuffix("\\").strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith("#") and not HOST_SPECIFIC.search(line)
    ]


def test_python_m_train_dry_run_prints_every_design_value():
    detected = detect_gpus()
    pinned = [] if detected is None else ["--hardware", "MI355X"]  # on a GPU node, be explicit
    done = launcher_process(
        *("train", "--dry-run", "--num-gpus-per-node", "8", "--run-id", RECORD_RUN_ID, *pinned),
        HIP_VISIBLE_DEVICES="2,5",
        WANDB_API_KEY="k-1",
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("\n") <= 1, "at most the note on --hardware auto"
    shown = {line.strip().removesuffix("\\").strip() for line in done.stdout.splitlines()}
    missing = [value for value in design_values() if value not in shown]
    assert not missing
    assert {"--num-gpus 8", "CUDA_VISIBLE_DEVICES=2,5", "--sglang-lora-backend triton"} <= shown
    assert "# hardware: MI355X" in done.stdout or match_hardware(detected or "")


def test_python_m_bad_input_is_one_line_without_traceback():
    done = launcher_process("train", "--hardware", "MI300X", "--dry-run")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


CPU_PROG = "python -m launchers.cpu.run_tiny_qwen3_lora"
NO_GPU = "CPU has no GPU; drop --num-gpus-per-node"


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["prepare", "--set", "seed=99999999999999999999"], "--seed must be in [0, 4294967295]"),
        (["train", "--set", "seed=-1"], "--seed must be in [0, 4294967295] (got -1)"),
        (["train", "--ray-num-cpus=-1"], "--ray-num-cpus must be >= 1 (got -1)"),
        (["worker", "--head-address", "h", "--ray-num-cpus", "0"], "--ray-num-cpus must be >= 1"),
        (["train", "--actor-ranks", "0"], "--actor-ranks must be >= 1 (got 0)"),
        (
            ["train", "--output-dir", "/o/x\udcff"],
            "--output-dir holds a byte that is not UTF-8 (/o/x\\xff)",
        ),
        (["prepare", "--model-dir", "/m\udce9"], "--model-dir holds a byte that is not UTF-8"),
        (["train", "--extra-env", "K=\udcff"], "--extra-env holds a byte that is not UTF-8\n"),
        (["train", "--num-gpus-per-node", "2"], NO_GPU),
        (["worker", "--head-address", "h", "--num-gpus-per-node", "2"], NO_GPU),
        (["sbatch", "--num-nodes", "2", "--num-gpus-per-node", "2"], NO_GPU),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["live", "dry-run"])
def test_cpu_launcher_bad_input_is_one_line_exit_2_and_nothing_runs(argv, reason, dry_run, capsys):
    spy = SpyRunner()
    status, out, err = cli(CPU, [*argv, *["--dry-run"] * dry_run], capsys, live=spy)
    assert status == 2
    assert out == "" and spy.plans == []
    assert err.count("\n") == 1 and err.startswith(f"{CPU_PROG}: error: ")
    assert reason in err


def test_an_output_dir_that_cannot_be_written_stops_a_live_run_before_it_starts(tmp_path, capsys):
    """The live runner of this host checks the run's output dir before it claims or starts
    anything (the job would fail on it only once Ray runs)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ports = LauncherPorts.draw().argv()
    argv = ["train", "--run-id", "unwritable", "--output-dir", str(blocker / "out"), *ports]
    status = run(CPU, argv)
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err == (
        f"{CPU_PROG}: error: train.py --output-dir {blocker}/out/unwritable: "
        "cannot write there (Not a directory)\n"
    ), "the run started"


def test_a_secret_value_in_a_setting_is_refused_never_shown(capsys):
    """In train.py's argv a secret is visible to every user of the node (``ps``)."""
    secret = "s3cr3t-service-token"
    for extra in (
        ["--set", f"wandb-project={secret}", "--extra-env", f"MY_SERVICE_TOKEN={secret}"],
        ["--set", f"wandb-project={secret}"],
    ):
        for dry_run in ([], ["--dry-run"]):
            spy = SpyRunner()
            status, out, err = cli(
                CPU, ["train", *extra, *dry_run], capsys, live=spy, MY_SERVICE_TOKEN=secret
            )
            assert (status, out, spy.plans) == (2, "", [])
            assert secret not in err and err.count("\n") == 1
            assert "--set holds the value of MY_SERVICE_TOKEN, a secret" in err


def test_pass_env_takes_a_variable_by_name_and_refuses_a_missing_one(capsys):
    spy = SpyRunner()
    status, _, err = cli(CPU, ["train", "--pass-env", "MY_KEY"], capsys, live=spy)
    assert status == 2 and "--pass-env MY_KEY: it is not set in this environment" in err
    status, _, _ = cli(CPU, ["train", "--pass-env", "MY_KEY"], capsys, live=spy, MY_KEY="k-1")
    (job,) = [step for step in spy.plans[0].steps if step.kind == "ray_job_submit"]
    assert status == 0 and job.secret_env == {"MY_KEY": "k-1"}
    status, _, err = cli(CPU, ["train", "--pass-env", "MY-KEY"], capsys, live=SpyRunner())
    assert status == 2 and "--pass-env items must be variable names" in err
