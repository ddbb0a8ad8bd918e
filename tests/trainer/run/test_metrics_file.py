"""metrics.jsonl as a killed run leaves it: a torn last line is dropped (and named), damage
anywhere else is one line."""

from __future__ import annotations

import json

import pytest

from trainer.run.metrics import (
    METRICS_FILE,
    MetricsError,
    MetricsLogger,
    parse_metrics,
    read_metrics,
    torn_tail,
)

TORN = '{"step": 3, "rollout/reward_mean": 0.2'


def write(path, steps, tail=""):
    path.write_text("".join(json.dumps({"step": s, "x": s / 10}) + "\n" for s in steps) + tail)


def test_a_torn_last_line_is_dropped_and_named(tmp_path):
    path = tmp_path / METRICS_FILE
    write(path, range(3), TORN)
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    assert parse_metrics(path)[1] == TORN
    assert torn_tail(path) == (
        f"{path}: dropping its torn last line {TORN!r} (a run killed while writing it)"
    )
    path.write_bytes(path.read_bytes()[:-5] + b"\xe2\x82")  # cut inside a UTF-8 character
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2] and torn_tail(path)


def test_a_whole_file_has_no_torn_line(tmp_path):
    path = tmp_path / METRICS_FILE
    assert read_metrics(path) == [] and torn_tail(path) is None  # no file yet
    write(path, range(2), '{"step": 2}')  # the last record whole, only its newline missing
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2] and torn_tail(path) is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"step": 0}\n{"step": 1, "x"\n{"step": 2}\n', ":2: invalid JSON ("),
        (b'{"step": 0}\n{"step": 1, "x": "\xff"}\n{"step": 2}\n', ":2: invalid JSON (not UTF-8)"),
        ('{"step": 0}\n[1, 2]\n', ":2: not a metrics record (no 'step')"),
        ('{"step": 0}\n{"no_step": 1}', ":2: not a metrics record (no 'step')"),
    ],
)
def test_damage_before_the_last_line_is_one_line(tmp_path, content, reason):
    path = tmp_path / METRICS_FILE
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(MetricsError) as raised:
        read_metrics(path)
    assert str(raised.value).startswith(f"{path}{reason}") and "\n" not in str(raised.value)


def test_a_resumed_logger_rewrites_the_file_without_the_torn_line(tmp_path):
    path = tmp_path / METRICS_FILE
    write(path, range(3), TORN)
    logger = MetricsLogger(tmp_path, total_steps=5, start_step=3)
    logger.log(3, {"x": 0.3})
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3]
    assert path.read_text().count("\n") == 4 and torn_tail(path) is None


def test_a_fresh_logger_starts_over_whatever_the_old_file_holds(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    MetricsLogger(tmp_path, total_steps=2).log(0, {"x": 1.0})
    assert read_metrics(path) == [{"step": 0, "x": 1.0}]
