"""benchmarks/merged_training.py on the CPU's tiny model: the three trainers step, and the merged
trainer's weights are the engine's merge."""

from __future__ import annotations

import json

import pytest

from benchmarks import merged_training


def test_the_trainers_step_and_the_merged_weights_are_the_engines(capsys, tmp_path):
    """The merged trainer that keeps its merged weights for the step runs fewer operations than
    the one merging in every pass (one merge per layer instead of one per pass)."""
    merged_training.main(
        ["--device", "cpu", "--tiny", "--steps", "1", "--micro-batches", "2", "--micro-batch", "2",
         "--profile", "--json", str(tmp_path / "out.json")]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "tiny, cpu, 2 x 2 rows of 16 + 32 tokens (192 per step)" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split()[-1:] == ["n/a"]]
    assert rows == ["adapter", "merged", "merged-per-pass"]
    assert "merged weights equal the engine's merge bit for bit: yes" in out
    profiled = [line.split(":")[0] for line in out.splitlines() if " s on the CPU, " in line]
    assert profiled == ["adapter", "merged", "merged-per-pass"]
    profiles = json.loads((tmp_path / "out.json").read_text())["profiles"]
    assert all(p["host_ops"] > 0 and p["device_busy_s"] is None for p in profiles.values())
    assert all(p["top"] and p["wall_s"] > 0 for p in profiles.values())
    assert profiles["merged"]["host_ops"] < profiles["merged-per-pass"]["host_ops"]


def test_counts_below_one_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        merged_training.main(["--device", "cpu", "--tiny", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps, --micro-batches and --micro-batch must be >= 1" in capsys.readouterr().err


def test_compile_layers_adds_the_merged_trainer_with_its_layers_compiled():
    assert list(merged_training.trainer_options(False)) == ["adapter", "merged", "merged-per-pass"]
    compiled = merged_training.trainer_options(True)
    assert list(compiled)[:3] == ["adapter", "merged", "merged-per-pass"]
    assert compiled["merged-compiled"] == {"merged": True, "compile_layers": True}
