"""`python -m trainer.run.plot`: a run's curves from its metrics.jsonl."""

from __future__ import annotations

import json

from trainer.run import plot


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plot_renders_a_png(tmp_path, capsys):
    records = [
        {"step": i, "rollout/reward_mean": i / 10, "rollout/reward_std": 0.1, "train/kl": i / 100}
        for i in range(6)
    ]
    records[-1]["eval/tiny"] = 0.5
    write(tmp_path / "metrics.jsonl", records)
    out = tmp_path / "plots" / "curves.png"
    assert plot.main([str(tmp_path / "metrics.jsonl"), "-o", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert capsys.readouterr().out == f"6 steps -> {out}\n"


def test_series_picks_keys_and_prefixes():
    records = [{"step": 0, "eval/a": 1.0, "x": 2.0}, {"step": 1, "eval/b": 3.0, "x": None}]
    assert plot.series(records, "eval/*") == {"eval/a": ([1], [1.0]), "eval/b": ([2], [3.0])}
    assert plot.series(records, "x") == {"x": ([1], [2.0])}


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert plot.main([str(tmp_path / "missing.jsonl")]) == 2
    write(tmp_path / "bad.jsonl", [{"no_step": 1}])
    assert plot.main([str(tmp_path / "bad.jsonl")]) == 2
    err = capsys.readouterr().err.splitlines()
    prefix = "python -m trainer.run.plot: error:"
    assert err == [
        f"{prefix} {tmp_path / 'missing.jsonl'}: no such file",
        f"{prefix} {tmp_path / 'bad.jsonl'}:1: not a metrics record (no 'step')",
    ]


def test_an_output_that_is_no_image_format_is_one_line_before_reading(tmp_path, capsys):
    write(tmp_path / "metrics.jsonl", [{"step": 0, "rollout/reward_mean": 0.1}])
    assert plot.main([str(tmp_path / "metrics.jsonl"), "-o", str(tmp_path / "p.txt")]) == 2
    assert plot.main([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "curves")]) == 2
    (blocker := tmp_path / "file").write_text("")
    assert plot.main([str(tmp_path / "metrics.jsonl"), "-o", str(blocker / "p.png")]) == 2
    err = capsys.readouterr().err.splitlines()
    prefix = "python -m trainer.run.plot: error: -o"
    assert len(err) == 3
    assert err[0].startswith(f"{prefix} {tmp_path / 'p.txt'}: end it in .png or another image")
    assert err[1].startswith(f"{prefix} {tmp_path / 'curves'}: end it in .png")
    assert err[2] == f"{prefix} {blocker / 'p.png'}: cannot write it (File exists)"
    assert not list(tmp_path.glob("p.txt*")) and not list(tmp_path.glob("curves*"))


def test_a_torn_last_line_is_left_out_and_named(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    write(path, [{"step": 0, "rollout/reward_mean": 0.1}, {"step": 1, "rollout/reward_mean": 0.2}])
    with path.open("a") as f:
        f.write('{"step": 2, "rollout/rew')
    assert plot.main([str(path), "-o", str(tmp_path / "c.svg")]) == 0
    out, err = capsys.readouterr()
    assert out == f"2 steps -> {tmp_path / 'c.svg'}\n"
    assert err == (
        f"python -m trainer.run.plot: {path}: dropping its torn last line "
        '\'{"step": 2, "rollout/rew\' (a run killed while writing it)\n'
    )
