"""benchmarks/recompute_layers.py on the CPU's tiny model: one trainer per count of recomputed
layers steps over the same micro-batches, reported beside `auto`'s estimate of it, and bad
counts are usage errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import recompute_layers


def test_each_count_of_recomputed_layers_steps_in_turn(capsys, tmp_path):
    recompute_layers.main(
        ["--device", "cpu", "--tiny", "--steps", "2", "--micro-batches", "2", "--micro-batch",
         "2", "--response-len", "32", "--layers=-1,1", "--json", str(tmp_path / "out.json"),
         "--inputs", str(tmp_path / "inputs")]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("built model and prompts in ")
    assert (tmp_path / "inputs" / "model" / "benchmark-model.json").is_file()
    assert (
        "tiny, cpu, 2 x 2 rows of 16 + 32 tokens (192 per step), LoRA r64 all-linear, merged" in out
    )
    rows = [line.split() for line in out.splitlines() if line.split()[3:4] == ["n/a"]]
    assert [row[0] for row in rows] == ["all", "1"]
    assert rows[0][-1] == "1.00x"
    results = json.loads((tmp_path / "out.json").read_text())
    assert list(results) == ["-1", "1"]
    assert all(len(r["times"]) == 2 and r["peak"] == 0 for r in results.values())
    # auto's estimate beside the peak: every layer's input and one layer's worth recomputed at a
    # time, against one layer kept and one input (the tiny model has two layers)
    kept_one = results["1"]["estimate"]
    assert 0 < kept_one < results["-1"]["estimate"]
    assert [row[4] for row in rows] == [
        f"{results[count]['estimate'] / 2**30:.2f}" for count in ("-1", "1")
    ]


def test_profile_summarizes_one_more_step_of_each_count(capsys, tmp_path):
    recompute_layers.main(
        ["--device", "cpu", "--tiny", "--steps", "1", "--micro-batches", "1", "--response-len",
         "16", "--layers=-1,0", "--profile", "--json", str(tmp_path / "out.json")]
    )  # fmt: skip
    out = capsys.readouterr().out
    summary = out.split("one more step of each under torch.profiler")[1].splitlines()[1:]
    heads = [line for line in summary if not line.startswith("  ")]
    assert [head.split(":")[0] for head in heads] == ["all recomputed", "0 recomputed"]
    assert all(" s on the CPU, " in head and head.endswith(" aten ops") for head in heads)
    profiles = [r["profile"] for r in json.loads((tmp_path / "out.json").read_text()).values()]
    assert all(p["kernels"] == 0 and 0 < len(p["top"]) <= 12 for p in profiles)
    # backward through a recomputed layer runs its forward's attention again
    attention = [
        sum(calls for name, _, calls in p["top"] if name == "aten::scaled_dot_product_attention")
        for p in profiles
    ]
    assert attention[0] > attention[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers=-2"], "-1 (every layer) or >= 0"),
        (["--layers=4,4"], "each count once"),
        (["--layers", "all"], "not a list of integers"),
        (["--steps", "0"], "must be >= 1"),
    ],
)
def test_bad_counts_are_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        recompute_layers.main(["--device", "cpu", "--tiny", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
