"""Another local user, or a second launch, cannot take a run over: the run's token reaches its
own Ray alone, its files are written where only its user can write, and one launch holds a
run's devices and output dir at a time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import ownership
from harness.cli import run
from harness.context import build_plan, check_local_outputs
from harness.errors import LaunchError
from harness.host import CHECKOUT, local_host
from harness.live import StepFailed, execute_plan, run_step
from harness.locks import exclusive_lock
from harness.run_tag import OUTPUT_LOCK, RunTag
from harness.steps import ClaimRun, Shell, Step
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from tests.support.listening import Server, another_user_or_skip, http_server
from tests.support.private_ray import LauncherPorts
from trainer import tiny

FILE = f"{CHECKOUT}/launchers/cpu/run_tiny_qwen3_lora.py"


def cpu_plan(tmp_path: Path, run_id: str, entrypoint: str = "train", **options: object):
    args = CPU.args(
        **{
            "model_dir": str(tmp_path / "models"),
            "data_dir": str(tmp_path / "data"),
            "output_dir": str(tmp_path / "outputs"),
            "run_id": run_id,
            **options,
        }
    )
    return build_plan(CPU, entrypoint, args, local_host())


def recorder(ran: list[Step]):
    def record(step: Step, env) -> None:
        ran.append(step)

    return record


@pytest.mark.ray
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("cpu_launcher_slot")  # it holds the CPU launcher's slot
def test_the_token_never_reaches_a_port_taken_between_the_claim_and_ray_start(tmp_path, capsys):
    """Another user binds the job server's port once the claim has checked it and before
    ``ray start``: Ray's dashboard cannot start (``ray start`` still exits 0), the launcher
    says so in one line instead of submitting, and its half-started Ray is released."""
    another_user_or_skip()
    tiny.build(tmp_path / "models" / "tiny-qwen3", tmp_path / "data" / "tiny-task", seed=0)
    ports = LauncherPorts.draw()
    plan = cpu_plan(
        tmp_path,
        "taken",
        ray_port=ports.ray,
        dashboard_port=ports.dashboard,
        agent_port=ports.agent,
        client_server_port=ports.client_server,
    )
    tag = RunTag(FILE, "cpu", "taken")
    impostors: list[Server] = []
    with contextlib.ExitStack() as attack:

        def run_then_attack(step: Step, env) -> None:
            run_step(step, env)
            if isinstance(step, ClaimRun):
                impostors.append(
                    attack.enter_context(http_server(ports.dashboard, other_user=True))
                )

        try:
            status = execute_plan(plan, run_then_attack)
            left = ownership.of_run(tag, ownership.processes())
        finally:
            ownership.release(tag)
        sent = impostors[0].stop()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("==> error")]
    assert sent == [], "the run's token went to another user's server"
    assert status == 1
    assert len(errors) == 1 and f"127.0.0.1:{ports.dashboard}: not this run's Ray" in errors[0]
    assert "uid 4242" in errors[0] and "Traceback" not in err
    assert "Ray job" not in err, "a job was submitted"
    assert left == [], "the half-started Ray outlives the refusal"
    assert not Path(tag.run_dir).exists()


def test_an_output_dir_others_can_write_to_is_refused_before_anything_runs(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user could plant a symlink in it
    plan = cpu_plan(tmp_path, "shared", output_dir=str(shared))
    with pytest.raises(
        LaunchError,
        match=r"--output-dir .*shared: .*shared may be changed by other users \(mode 777\)",
    ):
        check_local_outputs(plan)
    shared.chmod(0o755)
    check_local_outputs(plan)


def test_a_planted_symlink_at_the_slurm_script_is_replaced_not_followed(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    run_dir = tmp_path / "outputs" / "slurm"
    run_dir.mkdir(parents=True)
    (run_dir / "sbatch.sh").symlink_to(victim)
    argv = ["sbatch", "--num-nodes", "2", "--head-address", "n0", "--run-id", "slurm"]
    assert run(CPU, [*argv, "--output-dir", str(tmp_path / "outputs")]) == 0
    assert victim.read_text() == "precious\n" and victim.stat().st_mode & 0o777 == 0o600
    script = run_dir / "sbatch.sh"
    assert not script.is_symlink() and script.read_text().startswith("#!/bin/bash\n")


def test_a_second_launch_of_the_slot_is_refused_by_name_before_any_step(tmp_path, capsys):
    tag = RunTag("/c/launchers/x.py", "cpu", "first")
    second = ClaimRun(str(RunTag("/c/launchers/x.py", "cpu", "second")), "/c")
    ran: list[Step] = []
    plan = cpu_plan(tmp_path, "unused")
    with ownership.slot_lock(tag):
        status = execute_plan(plan.__class__(**{**vars(plan), "steps": (second,)}), recorder(ran))
    assert (status, ran) == (1, [])
    assert "refused: run 'first' (launcher pid " in capsys.readouterr().err


def test_two_launches_at_the_same_moment_one_runs_one_is_refused(tmp_path):
    """Both start together and claim the same slot: the claim is atomic (the slot's lock,
    held to the end), so one runs and the other is refused by name, never both."""
    script = textwrap.dedent(
        f"""
        import sys
        from harness.context import Plan
        from harness.hardware import get_hardware
        from harness.host import local_host
        from harness.live import execute_plan
        from harness.steps import ClaimRun, Shell
        from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER
        tag = "{tmp_path}/launcher.py@cpu/" + sys.argv[1]
        steps = (ClaimRun(tag, "{CHECKOUT}"), Shell(("sleep", "2")))
        plan = Plan(LAUNCHER, "train", get_hardware("CPU"), local_host(), steps)
        sys.exit(execute_plan(plan))
        """
    )
    launches = [
        subprocess.Popen(
            [sys.executable, "-c", script, run_id],
            cwd=CHECKOUT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run_id in ("a", "b")
    ]
    results = [(launch.wait(timeout=60), launch.stderr.read()) for launch in launches]
    for run_id in ("a", "b"):
        ownership.release(RunTag(f"{tmp_path}/launcher.py", "cpu", run_id))
    assert sorted(status for status, _ in results) == [0, 1], results
    refused = next(err for status, err in results if status == 1)
    assert "is starting or in progress" in refused and "Traceback" not in refused


@pytest.mark.usefixtures("cpu_launcher_slot")  # it holds the CPU launcher's slot
def test_one_output_dir_is_written_by_one_launch_at_a_time(tmp_path, capsys):
    """The same run id from another checkout (another launcher, another slot) would write
    the same output dir: refused by name before any step."""
    plan = cpu_plan(tmp_path, "shared-id")
    output = tmp_path / "outputs" / "shared-id"
    output.mkdir(parents=True)
    ran: list[Step] = []
    with exclusive_lock(str(output / OUTPUT_LOCK), "launchers.cpu.other_checkout"):
        assert execute_plan(plan, recorder(ran)) == 1
    assert ran == []
    err = capsys.readouterr().err
    assert f"{output} is being written by launchers.cpu.other_checkout (launcher pid" in err


def test_a_step_killed_by_a_signal_exits_as_a_shell_would_and_names_it(capsys):
    plan = cpu_plan(Path("/nonexistent"), "x", entrypoint="prepare")
    killed = Shell(("sh", "-c", "kill -TERM $$"))
    assert execute_plan(plan.__class__(**{**vars(plan), "steps": (killed,)})) == 128 + 15
    assert "error: sh was killed by SIGTERM" in capsys.readouterr().err


@pytest.mark.usefixtures("cpu_launcher_slot")  # it holds the CPU launcher's slot
def test_inputs_train_py_would_refuse_stop_the_launch_before_the_claim(tmp_path, capsys):
    """No model yet (``train`` before ``prepare``): one line and exit 2 before any Ray."""
    ran: list[Step] = []
    assert execute_plan(cpu_plan(tmp_path, "no-model"), recorder(ran)) == 2
    assert ran == []
    err = capsys.readouterr().err
    assert "train.py would refuse its inputs: --hf-checkpoint" in err
    assert "Traceback" not in err


def test_a_terminated_claim_subprocess_is_128_plus_n():
    """A negative return code (killed by a signal) is never handed to sys.exit as is (it
    became 241 for SIGTERM)."""
    with pytest.raises(StepFailed) as failure:
        run_step(
            Shell((sys.executable, "-c", "import os; os.kill(os.getpid(), 9)")), dict(os.environ)
        )
    assert failure.value.exit_code == 128 + signal.SIGKILL
    assert "was killed by SIGKILL" in str(failure.value)
