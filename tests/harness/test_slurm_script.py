"""The Slurm batch script of `sbatch`: every value quoted for bash and for sbatch's own reading
of ``#SBATCH`` lines, or refused in one line where no quoting can carry it."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from harness.cli import run
from launchers.cpu.run_tiny_qwen3_lora import LAUNCHER as CPU
from tests.harness.test_cli import SpyRunner

PROG = "python -m launchers.cpu.run_tiny_qwen3_lora"
MODULE = "launchers.cpu.run_tiny_qwen3_lora"


def sbatch_directives(script: str) -> list[str]:
    """The options sbatch takes from the ``#SBATCH`` lines of `script`, read as Slurm's
    ``_get_argument`` (src/sbatch/opt.c) reads them: whitespace splits, single or double quotes
    group, a backslash takes the next character as it is, an unquoted ``#`` ends the line, and
    an unmatched quote is fatal."""
    options = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#SBATCH"):
            break  # sbatch stops at the first line that is not a comment
        rest, i = line[len("#SBATCH") :], 0
        while i < len(rest):
            if rest[i].isspace():
                i += 1
                continue
            argument, quote, escaped = [], "", False
            while i < len(rest) and (quote or not rest[i].isspace()):
                char = rest[i]
                i += 1
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                    continue
                elif quote:
                    if char == quote:
                        quote = ""
                        continue
                elif char in "'\"":
                    quote = char
                    continue
                elif char == "#":
                    i = len(rest)
                    break
                argument.append(char)
            if quote:
                raise ValueError(f"sbatch: unmatched {quote} in {line!r}")
            if argument:
                options.append("".join(argument))
    return options


def test_a_path_no_quoting_can_carry_is_refused_in_one_line(tmp_path, capsys):
    """A newline would end the ``#SBATCH --output`` line and start a command of the script."""
    hostile = f"{tmp_path}/sb\ntouch {tmp_path}/PWNED;#"
    for dry_run in ([], ["--dry-run"]):
        spy = SpyRunner()
        argv = ["sbatch", "--num-nodes", "2", "--output-dir", hostile, *dry_run]
        assert run(CPU, argv, live=spy) == 2 and spy.plans == []
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1
        assert err.startswith(f"{PROG}: error: --output-dir {hostile!r}: a Slurm batch script")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def stub_bin(tmp_path: Path) -> Path:
    """``scontrol``, ``srun`` and ``python3`` that record what they are given: srun runs its
    command, python3 writes its argv (NUL-separated) to a file of its own under calls/."""
    folder, calls = tmp_path / "bin", tmp_path / "calls"
    folder.mkdir()
    calls.mkdir()
    stubs = {
        # a long node list, past a pipe's buffer: the script must read it to its end
        "scontrol": "exec seq -f node-%g 0 99999\n",
        "srun": 'while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n',
        "python3": f'to="{calls}/$$"\nprintf "%s\\0" "$@" > "$to.part" && mv "$to.part" "$to"\n',
    }
    for name, body in stubs.items():
        (folder / name).write_text(f"#!/bin/bash\n{body}")
        (folder / name).chmod(0o755)
    return folder


def test_a_hostile_path_reaches_sbatch_and_the_launchers_intact(tmp_path, stub_bin, capsys):
    outputs = f"{tmp_path}/out puts 'q' \"d\" $(touch {tmp_path}/PWNED);x #50%"
    argv = ["sbatch", "--num-nodes", "2", "--run-id", "r", "--output-dir", outputs]
    assert run(CPU, argv) == 0
    _, err = capsys.readouterr()
    script_path = f"{outputs}/r/sbatch.sh"
    (hint,) = [line for line in err.splitlines() if line.startswith("submit it with: ")]
    assert shlex.split(hint.removeprefix("submit it with: ")) == ["sbatch", script_path]
    script = Path(script_path).read_text()

    assert sbatch_directives(script) == [
        "--job-name=r",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--output={outputs.replace('%', '%%')}/r/slurm-%j.out",  # %% is Slurm's literal %
    ]

    env = {
        **os.environ,
        "PATH": f"{stub_bin}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[0-1]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    done = subprocess.run(["bash", script_path], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    calls = tmp_path / "calls"
    deadline = time.monotonic() + 30  # the worker's srun runs in the background
    while len([p for p in calls.iterdir() if p.suffix != ".part"]) < 2:
        assert time.monotonic() < deadline, list(calls.iterdir())
        time.sleep(0.05)
    launched = sorted(p.read_text().split("\0")[:-1] for p in calls.iterdir())
    options = ["--output-dir", outputs, "--run-id", "r"]
    assert [argv[:3] for argv in launched] == [["-m", MODULE, "train"], ["-m", MODULE, "worker"]]
    for argv in launched:
        index = argv.index("--output-dir")
        assert argv[index : index + 4] == options
    assert not (tmp_path / "PWNED").exists()


def test_the_script_holds_no_secret_and_passes_them_by_name(tmp_path, stub_bin, capsys):
    """``--extra-env MY_SERVICE_TOKEN=...`` becomes ``--pass-env MY_SERVICE_TOKEN``: Slurm
    hands the variable from the submitting environment to the job; the script stops at once,
    naming it, where it was not exported. Nothing else of the option changes."""
    secret = "s3cr3t-value-of-the-service"
    argv = ["sbatch", "--num-nodes", "2", "--run-id", "r", "--output-dir", str(tmp_path)]
    extra = ["--extra-env", f"LOG_LEVEL=debug,MY_SERVICE_TOKEN={secret}", "--pass-env", "HF_TOKEN"]
    for dry_run in (["--dry-run"], []):
        assert run(CPU, [*argv, *extra, *dry_run]) == 0
        out, _ = capsys.readouterr()
        assert secret not in out
    script = (tmp_path / "r" / "sbatch.sh").read_text()
    assert secret not in script
    assert "--extra-env LOG_LEVEL=debug --pass-env HF_TOKEN,MY_SERVICE_TOKEN" in script
    env = {
        **os.environ,
        "PATH": f"{stub_bin}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node-[0-1]",
        "SLURM_JOB_NUM_NODES": "2",
        "HF_TOKEN": "hf_x",
    }
    env.pop("MY_SERVICE_TOKEN", None)
    done = subprocess.run(["bash", str(tmp_path / "r" / "sbatch.sh")], env=env, text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode != 0 and list((tmp_path / "calls").iterdir()) == []
    assert done.stderr.strip().endswith("MY_SERVICE_TOKEN: export MY_SERVICE_TOKEN before sbatch")
