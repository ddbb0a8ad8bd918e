"""benchmarks/merged_training.py on the CPU's tiny model: both trainers step, and the merged
trainer's weights are the engine's merge."""

from __future__ import annotations

import pytest

from benchmarks import merged_training


def test_both_trainers_step_and_the_merged_weights_are_the_engines(capsys):
    merged_training.main(
        ["--device", "cpu", "--tiny", "--steps", "1", "--micro-batches", "2", "--micro-batch", "2"]
    )
    out = capsys.readouterr().out
    assert "tiny, cpu, 2 x 2 rows of 16 + 32 tokens (192 per step)" in out
    rows = [line.split()[0] for line in out.splitlines() if line.split()[-1:] == ["n/a"]]
    assert rows == ["adapter", "merged"]
    assert "merged weights equal the engine's merge bit for bit: yes" in out


def test_counts_below_one_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        merged_training.main(["--device", "cpu", "--tiny", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps, --micro-batches and --micro-batch must be >= 1" in capsys.readouterr().err
