"""Bad inputs that used to end in a traceback, some only after Ray and the model had started:
each is now one line and exit 2 from ``train.py``, before its preflight and before Ray.

All cases run in one Python process (`DRIVER`), which calls ``trainer.main.main`` for each with
``RAY_TMPDIR`` pointing at an empty folder: the folder is still empty at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_loop import ROOT, make_loop, recipe_argv, tiny_dirs  # noqa: F401  (fixture)
from trainer import checkpoint

DRIVER = """
import contextlib, io, json, sys
from trainer.main import main

results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit:  # a bad argv: parse_args_or_exit exits 2
            status = exit.code
    results.append({"status": status, "out": out.getvalue(), "err": err.getvalue()})
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def saved_run(tiny_dirs, tmp_path_factory) -> Path:  # noqa: F811
    """A real checkpoint (iteration 1: adapter, trainer_state.pt, state.json) of the recipe."""
    model, data = tiny_dirs
    root = tmp_path_factory.mktemp("saved")
    loop, _ = make_loop(
        recipe_argv(model, data, root / "out", "--num-rollout", "1", "--save", str(root / "ckpt"))
    )
    loop.run()
    assert checkpoint.latest_iteration(root / "ckpt") == 1
    return root / "ckpt"


def damaged_copy(source: Path, into: Path, name: str, damage: Callable[[Path], None]) -> Path:
    """A copy of folder `source` at `into` whose file `name` went through `damage`."""
    shutil.copytree(source, into)
    damage(into / name)
    return into


def cut(path: Path) -> None:
    """What a kill or a full disk leaves of a file: its first 40 bytes."""
    path.write_bytes(path.read_bytes()[:40])


def listed(path: Path) -> None:
    path.write_text("[1, 2]")


def broken_template(path: Path) -> None:
    path.write_text("{% if %}")


def test_bad_inputs_are_one_line_before_anything_starts(tiny_dirs, saved_run, tmp_path):  # noqa: F811
    model, data = tiny_dirs
    latest = checkpoint.iter_dir(saved_run, 1).name

    def argv(*extra: str, model_dir: Path = model, prompts: Path = data / "train.jsonl"):
        base = recipe_argv(model_dir, data, tmp_path / "out", *extra)
        base[base.index("--prompt-data") + 1] = str(prompts)
        return base

    def damaged_model(name: str, damage: Callable[[Path], None]) -> list[str]:
        into = tmp_path / f"model-{damage.__name__}-{name}"
        return argv(model_dir=damaged_copy(model, into, name, damage))

    def damaged_checkpoint(name: str) -> list[str]:
        load = damaged_copy(
            saved_run, tmp_path / f"ckpt-{Path(name).name}", f"{latest}/{name}", cut
        )
        return argv("--load", str(load))

    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes((data / "train.jsonl").read_bytes() + b'{"prompt": "caf\xe9", "label": 1}\n')
    (blocker := tmp_path / "a-file").write_text("")
    cases = {
        "prompt data not UTF-8": (
            argv(prompts=latin1),
            f"{latin1}:257: not UTF-8 (byte 0xe9 at column 16); save the file as UTF-8",
        ),
        "chat template that does not compile": (
            damaged_model("chat_template.jinja", broken_template),
            "its chat template fails (line 1: Expected an expression",
        ),
        "no chat template": (
            damaged_model("chat_template.jinja", Path.unlink),
            "has no chat template; drop --apply-chat-template",
        ),
        "tokenizer_config.json not an object": (
            damaged_model("tokenizer_config.json", listed),
            "tokenizer_config.json: a JSON list, not an object",
        ),
        "model.safetensors cut short": (
            damaged_model("model.safetensors", cut),
            "model.safetensors: not a complete safetensors file",
        ),
        "state.json cut short": (
            damaged_checkpoint("state.json"),
            f"{latest}/state.json: not valid JSON",
        ),
        "trainer_state.pt cut short": (
            damaged_checkpoint("trainer_state.pt"),
            f"{latest}/trainer_state.pt: not a complete torch.save archive",
        ),
        "adapter cut short": (
            damaged_checkpoint("adapter/adapter_model.safetensors"),
            f"{latest}/adapter/adapter_model.safetensors: not a complete safetensors file",
        ),
        "output dir that cannot be made": (
            [*argv(), "--output-dir", str(blocker / "out")],
            f"--output-dir {blocker / 'out'}: cannot write there (Not a directory)",
        ),
        "checkpoint of another LoRA rank": (
            argv("--load", str(saved_run), "--lora-rank", "8"),
            f"{latest}/adapter/adapter_config.json: trained with --lora-rank 4, this run asks "
            "for 8; resume with --lora-rank 4, or start without --load",
        ),
        "seed beyond 32 bits": (
            [*argv(), "--seed", "99999999999999999999"],
            "--seed must be in [0, 4294967295] (got 99999999999999999999)",
        ),
    }
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps([case for case, _ in cases.values()]),
        cwd=ROOT,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for (name, (_, reason)), result in zip(cases.items(), results, strict=True):
        err = result["err"]
        assert result["status"] == 2, f"{name}: {result}"
        assert err.startswith("train.py: error: ") and err.count("\n") == 1, f"{name}: {err}"
        assert reason in err, f"{name}: {err}"
        assert "preflight:" not in result["out"], f"{name}: the run went on to its preflight"
    assert list(ray_tmp.iterdir()) == [], "Ray started"
