"""Checkpoints: layout, the atomic ``latest`` marker, and an exact resume of the loop."""

from __future__ import annotations

import json

import pytest

from tests.test_loop import make_loop, recipe_argv, tiny_dirs  # noqa: F401  (fixture)
from trainer import checkpoint
from trainer.metrics import METRICS_FILE, read_metrics


def fake_trainer_save(path) -> None:
    (path / "adapter").mkdir()
    (path / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")


def test_save_writes_the_iteration_then_the_marker(tmp_path):
    assert checkpoint.latest_iteration(None) is None
    assert checkpoint.latest_iteration(tmp_path / "missing") is None
    assert checkpoint.latest_iteration(tmp_path) is None

    path = checkpoint.save(tmp_path, 4, fake_trainer_save, {"rollout_index": 4})
    assert path == tmp_path / "iter_0000004"
    assert (tmp_path / "latest").read_text() == "4\n"
    assert checkpoint.latest_iteration(tmp_path) == 4
    assert checkpoint.load_state(tmp_path, 4) == {"rollout_index": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000004", "latest"]


def test_a_save_interrupted_before_the_marker_leaves_the_previous_checkpoint(tmp_path):
    checkpoint.save(tmp_path, 2, fake_trainer_save, {"rollout_index": 2})

    def dies(path):
        fake_trainer_save(path)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(tmp_path, 4, dies, {"rollout_index": 4})
    assert checkpoint.latest_iteration(tmp_path) == 2
    assert not (tmp_path / "iter_0000004").exists()
    checkpoint.save(tmp_path, 4, fake_trainer_save, {"rollout_index": 4})  # the retry succeeds
    assert checkpoint.latest_iteration(tmp_path) == 4


@pytest.mark.parametrize(("marker", "message"), [("x\n", "expected an iteration"), ("9\n", "9")])
def test_a_bad_marker_is_a_clear_error(tmp_path, marker, message):
    (tmp_path / "latest").write_text(marker)
    with pytest.raises(checkpoint.CheckpointError, match=message):
        checkpoint.latest_iteration(tmp_path)


def test_a_resumed_loop_continues_exactly_where_it_stopped(tiny_dirs, tmp_path):  # noqa: F811
    """4 rollouts in one go == 2 rollouts, a checkpoint, and a fresh loop resuming for 2 more,
    metrics included: the resumed run's first rollout checks, as the straight run's does, that
    the engine serves the adapter of the update before (here the checkpoint's)."""
    model, data = tiny_dirs
    straight, _ = make_loop(
        recipe_argv(model, data, tmp_path / "a", "--num-rollout", "4", "--save",
                    str(tmp_path / "a" / "ckpt"), "--save-interval", "2", "--check-adapter-sync")
    )  # fmt: skip
    straight.run()

    resumed_dir = tmp_path / "b"
    argv = recipe_argv(
        model, data, resumed_dir, "--num-rollout", "4", "--save", str(resumed_dir / "ckpt"),
        "--load", str(resumed_dir / "ckpt"), "--save-interval", "2", "--check-adapter-sync",
    )  # fmt: skip
    first, _ = make_loop(argv)
    generate = first.engines.generate
    calls = []

    def killed_in_rollout_3(prompts, params):
        calls.append(params)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return generate(prompts, params)

    first.engines.generate = killed_in_rollout_3
    with pytest.raises(KeyboardInterrupt):
        first.run()
    assert checkpoint.latest_iteration(resumed_dir / "ckpt") == 2
    state = checkpoint.load_state(resumed_dir / "ckpt", 2)
    assert state["rollout_index"] == 2 and state["data"]["offset"] == 8

    second, _ = make_loop(argv)
    assert second.restore() == 2
    assert second.pending is not None and second.pending.version == 4
    second.run()

    a = read_metrics(tmp_path / "a" / METRICS_FILE)
    b = read_metrics(resumed_dir / METRICS_FILE)
    assert [r["step"] for r in b] == [0, 1, 2, 3]

    def stable(record):
        return {k: v for k, v in record.items() if not k.startswith("time/")}

    assert [stable(r) for r in a] == [stable(r) for r in b]
    assert all("sync/engine_trainer_logprob_abs_diff" in r for r in b[1:])
    final_a = json.loads((tmp_path / "a" / "ckpt" / "iter_0000004" / "state.json").read_text())
    final_b = json.loads((resumed_dir / "ckpt" / "iter_0000004" / "state.json").read_text())
    assert final_a == final_b
