"""Trainer states as data (`trainer.run.tensor_state`): saved and loaded back exactly, the PEFT
trainer's and one shaped like Megatron's, and anything else refused in one line."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trainer.backends.megatron.trainer import optimizer_state
from trainer.backends.torch.trainer import lr_factor
from trainer.config import OptimizerConfig
from trainer.run import tensor_state


def assert_same(a, b, path="state"):
    """`a` and `b` equal in structure, Python types, int keys, and tensor dtype, shape and bits."""
    assert type(a) is type(b), (path, type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            assert_same(a[key], b[key], f"{path}/{key!r}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), path
    else:
        assert a == b, path


def round_trip(state, tmp_path: Path):
    tensor_state.save(state, tmp_path / "state")
    tensor_state.check(tmp_path / "state")
    return tensor_state.load(tmp_path / "state")


def trained_adamw(steps: int = 3):
    """An AdamW with a LambdaLR schedule as the PEFT trainer builds them, after `steps` steps."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    optim = OptimizerConfig(lr=1e-2, lr_warmup_iters=2, lr_decay_style="cosine", min_lr=1e-3)
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, optim, 10)
    )
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p)
        optimizer.step()
        scheduler.step()
    return params, optimizer, scheduler


def test_the_peft_trainers_state_comes_back_exactly_and_resumes_the_same_steps(tmp_path):
    params, optimizer, scheduler = trained_adamw()
    state = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "steps": 3,
        "torch_rng": torch.get_rng_state(),
    }
    loaded = round_trip(state, tmp_path)
    assert_same(state, loaded)
    assert list(loaded["optimizer"]["state"]) == [0, 1]  # int parameter ids
    assert loaded["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.99)  # a tuple again

    # A fresh optimizer and schedule given the loaded state take the same next step.
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    optim = OptimizerConfig(lr=1e-2, lr_warmup_iters=2, lr_decay_style="cosine", min_lr=1e-3)
    resumed = torch.optim.AdamW(copies, lr=optim.lr, betas=(0.9, 0.99))
    resumed_schedule = torch.optim.lr_scheduler.LambdaLR(
        resumed, functools.partial(lr_factor, optim, 10)
    )
    resumed.load_state_dict(loaded["optimizer"])
    resumed_schedule.load_state_dict(loaded["scheduler"])
    torch.set_rng_state(loaded["torch_rng"])
    grads = [torch.randn_like(p) for p in params]
    for group in (params, copies):
        for p, g in zip(group, grads, strict=True):
            p.grad = g.clone()
    optimizer.step(), scheduler.step()
    resumed.step(), resumed_schedule.step()
    for a, b in zip(params, copies, strict=True):
        assert a.detach().equal(b.detach())
    assert scheduler.get_last_lr() == resumed_schedule.get_last_lr()


def test_a_state_shaped_like_megatrons_comes_back_exactly(tmp_path):
    """One rank's Megatron state (`optimizer_state`): per chained optimizer, its inner torch
    optimizer's state dict and its main params, and an ``OptimizerParamScheduler``-like state
    of plain values; bf16 model weights beside fp32 main params."""
    inner = []
    for shape in ((8, 2), (5,)):
        main = torch.nn.Parameter(torch.randn(shape))
        adam = torch.optim.Adam([main], lr=2e-5)
        main.grad = torch.randn(shape)
        adam.step()
        inner.append(SimpleNamespace(optimizer=adam))
    scheduler = SimpleNamespace(
        state_dict=lambda: {
            "max_lr": 2e-5,
            "lr_warmup_steps": 0,
            "num_steps": 64,
            "lr_decay_style": "constant",
            "lr_decay_steps": 100,
            "min_lr": 0.0,
            "start_wd": 0.0,
            "end_wd": 0.0,
            "wd_incr_style": "constant",
            "wd_incr_steps": 100,
        }
    )
    state = optimizer_state(inner, scheduler, steps=1)
    state["extra"] = {"bf16": torch.randn(3).to(torch.bfloat16), "empty": torch.zeros(0),
                      "mask": torch.tensor([True, False]), "ids": torch.arange(3),
                      "inf": math.inf, "nan": math.nan, 7: None}  # fmt: skip
    loaded = round_trip(state, tmp_path)
    assert_same(state, loaded)
    assert [len(mains) for mains in loaded["main_params"]] == [1, 1]
    assert loaded["main_params"][0][0].equal(inner[0].optimizer.param_groups[0]["params"][0])


def test_the_files_are_data_a_person_can_read(tmp_path):
    state = {"optimizer": {"state": {0: {"step": torch.tensor(2.0)}}}, "steps": 2}
    tensor_state.save(state, tmp_path / "s")
    document = json.loads((tmp_path / "s.json").read_text())
    assert document == {
        "format": tensor_state.FORMAT,
        "state": {"dict": [
            ["optimizer", {"dict": [["state", {"dict": [
                [0, {"dict": [["step", {"tensor": "state/optimizer/state/0/step"}]]}]
            ]}]]}],
            ["steps", 2],
        ]},
    }  # fmt: skip


@pytest.mark.parametrize(
    "value",
    [object(), {1.5: 1}, {True: 1}, {"f": lambda: 0}, torch.float32],
    ids=["object", "float key", "bool key", "function", "dtype"],
)
def test_a_value_that_is_not_data_is_refused_when_saving(tmp_path, value):
    with pytest.raises(TypeError, match="cannot be saved as data"):
        tensor_state.save({"x": value}, tmp_path / "s")


@pytest.mark.parametrize(
    ("skeleton", "reason"),
    [
        ({"tensor": "absent"}, "state: names tensor 'absent', which the file lacks"),
        ({"pickle": "x"}, 'state: {"pickle": "x"} is not a state value'),
        ({"dict": [[1.5, 0]]}, "state: a dict entry must be a [str or int key, value] pair"),
        ({"dict": [["a", 0], ["a", 1]]}, "state: key 'a' appears twice"),
        ({"float": "1e999"}, 'state: {"float": "1e999"} is not a state value'),
        ({"tuple": [{"a": 1, "b": 2}]}, 'state/0: {"a": 1, "b": 2} is not a state value'),
    ],
)
def test_a_skeleton_save_cannot_write_is_one_line(tmp_path, skeleton, reason):
    tensor_state.save({}, tmp_path / "s")
    (tmp_path / "s.json").write_text(json.dumps({"format": tensor_state.FORMAT, "state": skeleton}))
    for read in (tensor_state.load, tensor_state.check):  # check: without reading tensors
        with pytest.raises(tensor_state.StateFormatError) as raised:
            read(tmp_path / "s")
        assert str(raised.value) == f"{tmp_path / 's.json'}: {reason}"


def test_a_file_of_another_format_is_one_line(tmp_path):
    tensor_state.save({}, tmp_path / "s")
    (tmp_path / "s.json").write_text('{"state": 1}')
    with pytest.raises(tensor_state.StateFormatError, match="not a grpo-lora-state/1 state file"):
        tensor_state.load(tmp_path / "s")
    tensor_state.save({}, tmp_path / "s")
    (tmp_path / "s.safetensors").write_bytes(b"\x80\x04pickled")
    with pytest.raises(tensor_state.StateFormatError, match="not a complete safetensors file"):
        tensor_state.load(tmp_path / "s")
