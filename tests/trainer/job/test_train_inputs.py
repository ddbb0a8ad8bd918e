"""Bad inputs that used to end in a traceback, some only after Ray and the model had started:
each is now one line and exit 2 from ``train.py``, before its preflight and before Ray.

All cases run in one Python process (`DRIVER`), which calls ``trainer.job.main.main`` for each with
``RAY_TMPDIR`` pointing at an empty folder: the folder is still empty at the end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.test_loop import ROOT, make_loop, recipe_argv, tiny_dirs  # noqa: F401  (fixture)
from trainer.run import checkpoint

DRIVER = """
import contextlib, io, json, sys
from trainer.job.main import main

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
    """A real checkpoint (iteration 1: adapter, trainer state, state.json) of the recipe."""
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


def edited_json(**changes: Any) -> Callable[[Path], None]:
    """A damage that sets `changes` (dotted keys reach into objects) in a JSON file."""

    def edit(path: Path) -> None:
        value = json.loads(path.read_text())
        for dotted, new in changes.items():
            *parents, key = dotted.split(".")
            target = value
            for parent in parents:
                target = target[parent]
            target[key] = new
        path.write_text(json.dumps(value))

    return edit


def nan_filled(path: Path) -> None:
    """An adapter of a run that diverged: every value NaN."""
    from safetensors.torch import load_file, save_file

    save_file({k: torch.full_like(v, math.nan) for k, v in load_file(path).items()}, path)


class Planted:
    """What another user plants as a ``trainer_state.pt``: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def planting(marker: Path) -> Callable[[Path], None]:
    """A damage that plants a `Planted` pickle (a ``torch.save`` archive) at the path."""

    def plant(path: Path) -> None:
        torch.save(Planted(marker), path)

    return plant


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

    def damaged_checkpoint(name: str, damage: Callable[[Path], None] = cut, *extra: str):
        into = tmp_path / f"ckpt-{len(list(tmp_path.glob('ckpt-*')))}"
        load = damaged_copy(saved_run, into, f"{latest}/{name}", damage)
        return argv("--load", str(load), *extra)

    def megatron_checkpoint(world_size: int) -> list[str]:
        """The recipe's checkpoint as Megatron lays one out, saved by `world_size` ranks."""
        into = tmp_path / "ckpt-megatron"
        damaged_copy(saved_run, into, f"{latest}/state.json", edited_json(train_backend="megatron"))
        optimizer = into / latest / "megatron_optimizer"
        optimizer.mkdir()
        layout = {"world_size": world_size, "tensor_model_parallel_size": world_size,
                  "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
                  "expert_model_parallel_size": 1}  # fmt: skip
        (optimizer / "layout.json").write_text(json.dumps(layout))
        for old in (into / latest).glob("trainer_state.*"):
            old.unlink()
        return argv("--load", str(into), "--train-backend", "megatron", "--device", "cuda")

    def with_rows(name: str, *rows: dict[str, Any]) -> Path:
        path = tmp_path / name
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        path.write_text((data / "train.jsonl").read_text() + lines)
        return path

    marker = tmp_path / "the-planted-pickle-ran"
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes((data / "train.jsonl").read_bytes() + b'{"prompt": "caf\xe9", "label": 1}\n')
    unlabelled = with_rows("unlabelled.jsonl", {"prompt": "say red"})
    long_prompt = "say " + " ".join(["red"] * 600)
    too_long = with_rows("long.jsonl", *[{"prompt": long_prompt, "label": "red"}] * 2)
    (blocker := tmp_path / "a-file").write_text("")
    (shared_out := tmp_path / "shared-out").mkdir()
    shared_out.chmod(0o777)  # no sticky bit: any user may plant a file in it
    (shared_parent := tmp_path / "shared-parent").mkdir()
    shared_parent.chmod(0o775)
    cases = {
        "prompt data not UTF-8": (
            argv(prompts=latin1),
            f"{latin1}:257: not UTF-8 (byte 0xe9 at column 16); save the file as UTF-8",
        ),
        "a row without the label key": (
            argv(prompts=unlabelled),
            f"{unlabelled}:257: missing key 'label' (row has: prompt)",
        ),
        "no model directory": (
            argv(model_dir=tmp_path / "no-model"),
            f"--hf-checkpoint {tmp_path / 'no-model'}: not a directory",
        ),
        "prompts longer than the model's context": (
            argv(prompts=too_long),
            f"--prompt-data {too_long}: 2 of 258 prompts do not fit the model's context: the "
            "longest is 606 tokens + --rollout-max-response-len 4 = 610 > 512 "
            "(max_position_embeddings); drop them with --rollout-max-prompt-len 508, or lower "
            "--rollout-max-response-len",
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
        "trainer state cut short": (
            damaged_checkpoint("trainer_state.safetensors"),
            f"{latest}/trainer_state.safetensors: not a complete safetensors file",
        ),
        "trainer state skeleton cut short": (
            damaged_checkpoint("trainer_state.json"),
            f"{latest}/trainer_state.json: not valid JSON",
        ),
        "adapter cut short": (
            damaged_checkpoint("adapter/adapter_model.safetensors"),
            f"{latest}/adapter/adapter_model.safetensors: not a complete safetensors file",
        ),
        "adapter missing": (
            damaged_checkpoint("adapter/adapter_model.safetensors", Path.unlink),
            f"{latest}/adapter/adapter_model.safetensors: missing; resume from another "
            "checkpoint, or start without --load",
        ),
        "trainer state missing": (
            damaged_checkpoint("trainer_state.safetensors", Path.unlink),
            f"{latest}: no trainer state to resume (",
        ),
        "a planted pickle of the old format": (
            damaged_checkpoint("trainer_state.pt", planting(marker)),
            f"{latest}/trainer_state.pt: a torch.save (pickle) file of an earlier version, "
            "which is never loaded (loading a pickle runs the code it names); start without "
            "--load, or with an empty --save directory",
        ),
        "output dir that cannot be made": (
            [*argv(), "--output-dir", str(blocker / "out")],
            f"--output-dir {blocker / 'out'}: cannot write there (Not a directory)",
        ),
        "output dir others may write to": (
            [*argv(), "--output-dir", str(shared_out)],
            f"--output-dir {shared_out}: {shared_out} may be changed by other users (mode 777)",
        ),
        "checkpoint dir below one others may write to": (
            argv("--load", str(shared_parent / "ckpt")),
            f"--load {shared_parent / 'ckpt'}: {shared_parent} may be changed by other users "
            "(mode 775)",
        ),
        "checkpoint of another LoRA rank": (
            argv("--load", str(saved_run), "--lora-rank", "8"),
            f"{latest}/adapter/adapter_config.json: trained with --lora-rank 4, this run asks "
            "for 8; resume with --lora-rank 4, or start without --load",
        ),
        "adapter whose config names another rank than its tensors": (
            damaged_checkpoint("adapter/adapter_config.json", edited_json(r=8), "--lora-rank", "8"),
            "adapter_model.safetensors: base_model.model.model.layers.0.mlp.down_proj.lora_A."
            "weight [4, 128] is a rank-4 LoRA tensor, but its adapter_config.json and this run "
            "say --lora-rank 8",
        ),
        "adapter of a run that diverged": (
            damaged_checkpoint("adapter/adapter_model.safetensors", nan_filled),
            "lora_A.weight holds NaN or infinite values (the run diverged before this save)",
        ),
        "data cursor offset beyond the prompts": (
            damaged_checkpoint("state.json", edited_json(**{"data.offset": 10**9})),
            "the data cursor (epoch 0, offset 1000000000) is not a position in 256 prompts",
        ),
        "data cursor epochs beyond the rollouts": (
            damaged_checkpoint("state.json", edited_json(**{"data.epoch": 10**9})),
            "is past what 1 rollouts take from 256 prompts",
        ),
        "data cursor of other types": (
            damaged_checkpoint("state.json", edited_json(**{"data.shuffle": "yes"})),
            "the data cursor's 'shuffle' is 'yes', not true or false",
        ),
        "rollout index that is not the checkpoint's": (
            damaged_checkpoint("state.json", edited_json(rollout_index="1")),
            "state.json: rollout_index is '1', not 1 (the checkpoint's number)",
        ),
        "checkpoint of another train backend": (
            damaged_checkpoint("state.json", edited_json(train_backend="megatron")),
            "state.json: saved by --train-backend megatron, this run uses torch",
        ),
        "Megatron checkpoint of another parallel layout": (
            megatron_checkpoint(world_size=8),
            f"{latest}: saved by 8 training ranks (--tensor-model-parallel-size 8, "
            "--pipeline-model-parallel-size 1, --context-parallel-size 1, "
            "--expert-model-parallel-size 1); this run has 1 training ranks "
            "(--tensor-model-parallel-size 1,",
        ),
        "seed beyond 32 bits": (
            [*argv(), "--seed", "99999999999999999999"],
            "--seed must be in [0, 4294967295] (got 99999999999999999999)",
        ),
    }
    if os.geteuid() == 0:  # root can hand a directory to another user
        (foreign := tmp_path / "foreign-save").mkdir()
        os.chown(foreign, 4242, 4242)
        cases["save dir of another user"] = (
            argv("--save", str(foreign)),
            f"--save {foreign}: {foreign} may be changed by other users (owner uid 4242)",
        )
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
    assert not marker.exists(), "the planted pickle was loaded"
    assert not (tmp_path / "out").exists(), "the checks made the output directory"
