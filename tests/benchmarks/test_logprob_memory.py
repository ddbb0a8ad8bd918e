"""`benchmarks/logprob_memory.py` on the CPU: the variants asked for, each timed after its
warm-up, and a clear error for a variant it does not know."""

from __future__ import annotations

import pytest

from benchmarks import logprob_memory

SMALL = ["--device", "cpu", "--tokens", "64", "--vocab", "512", "--hidden", "32"]


def test_each_variant_asked_for_is_reported(capsys):
    logprob_memory.main([*SMALL, "--variants", "before,after", "--warmup", "1", "--repeats", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("64 tokens, vocab 512, hidden 32, fp32, cpu")
    assert [line.split()[0] for line in lines[1:3]] == ["before", "after"]
    assert all("forward+backward" in line for line in lines[1:3])
    assert lines[3].startswith("peak ratio before/after: ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--variants", "after,fused"], "--variants: comma-separated of before, after, compiled"),
        (["--repeats", "0"], "--warmup must be >= 0 and --repeats >= 1"),
    ],
)
def test_bad_flags_are_refused_in_one_line(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        logprob_memory.parse([*SMALL, *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
