"""Prompt data: JSONL/Parquet, keys, chat templates, shuffling and the resumable cursor."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from trainer.arguments import UsageError, parse_args
from trainer.run.data import (
    DataError,
    RolloutDataSource,
    Sample,
    eval_sets,
    load_prompts,
    num_rollouts_for_epochs,
    rollout_source,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }} <|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = "<unk> <|im_start|> <|im_end|> system user assistant be brief what is 1+1 ? 2+2"
    backend = Tokenizer(
        models.WordLevel(vocab={w: i for i, w in enumerate(words.split())}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", eos_token="<|im_end|>"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def write_jsonl(path: Path, rows: list[dict] | list[str]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
        encoding="utf-8",
    )
    return path


def numbered(n: int) -> list[Sample]:
    return [Sample(i, f"p{i}", str(i)) for i in range(n)]


def test_plain_prompts_are_used_as_is(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "what is 1+1 ?", "label": "2", "source": "x"}, {"prompt": "q", "label": 3}],
    )
    samples = load_prompts(path)
    assert samples == [
        Sample(0, "what is 1+1 ?", "2", {"source": "x"}),
        Sample(1, "q", 3, {}),
    ]


def test_custom_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}])
    assert load_prompts(path, input_key="question", label_key="answer") == [Sample(0, "q", "a")]


def test_chat_template_for_messages_and_strings(tmp_path: Path, tokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1 ?"}]
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": messages, "label": "2"}, {"prompt": "2+2 ?", "label": "4"}],
    )
    samples = load_prompts(path, tokenizer=tokenizer, apply_chat_template=True)
    assert [s.prompt for s in samples] == [
        "<|im_start|>system be brief <|im_end|> <|im_start|>user 1+1 ? <|im_end|> "
        "<|im_start|>assistant ",
        "<|im_start|>user 2+2 ? <|im_end|> <|im_start|>assistant ",
    ]


def test_max_prompt_len_drops_long_prompts_and_keeps_row_indices(tmp_path: Path, tokenizer) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "what is 1+1 ?", "label": "2"}, {"prompt": "2+2", "label": "4"}],
    )
    samples = load_prompts(path, tokenizer=tokenizer, max_prompt_len=2)  # 4 tokens vs 1 token
    assert samples == [Sample(1, "2+2", "4")]
    with pytest.raises(DataError, match="no prompts of at most 0 tokens"):
        load_prompts(path, tokenizer=tokenizer, max_prompt_len=0)


@pytest.mark.parametrize(
    ("lines", "kwargs", "message"),
    [
        (
            ['{"prompt": "a", "label": "1"}', "", '{"prompt": "b"}'],
            {},
            r"d\.jsonl:3: missing key 'label' \(row has: prompt\)",
        ),
        (['{"question": "a"}'], {}, r"d\.jsonl:1: missing key 'prompt' \(row has: question\)"),
        (['{"prompt": "a", '], {}, r"d\.jsonl:1: invalid JSON"),
        (["[1, 2]"], {}, r"d\.jsonl:1: each line must be a JSON object"),
        (
            ['{"prompt": [{"role": "user", "content": "a"}], "label": "1"}'],
            {},
            r"d\.jsonl:1: the prompt is a chat message list; pass --apply-chat-template",
        ),
        (
            ['{"prompt": [{"text": "a"}], "label": "1"}'],
            {"apply_chat_template": True},
            r"d\.jsonl:1: chat messages must be objects with 'role' and 'content'",
        ),
        (['{"prompt": 5, "label": "1"}'], {}, r"d\.jsonl:1: the prompt must be a string"),
        ([""], {}, r"d\.jsonl: no prompts$"),
    ],
)
def test_bad_rows_name_file_and_line(
    tmp_path: Path, tokenizer, lines: list[str], kwargs: dict, message: str
) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", lines)
    with pytest.raises(DataError, match=message):
        load_prompts(path, tokenizer=tokenizer, **kwargs)


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="prompt data not found"):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "d.csv").write_text("prompt,label\n")
    with pytest.raises(DataError, match=r"must be \.jsonl, \.json \(JSON lines\) or \.parquet"):
        load_prompts(tmp_path / "d.csv")
    (tmp_path / "d.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        load_prompts(tmp_path / "d.parquet")
    assert issubclass(DataError, UsageError)  # train.py reports it as a usage error (exit 2)


def test_parquet_reads_like_jsonl(tmp_path: Path, tokenizer) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"prompt": [{"role": "user", "content": "1+1 ?"}], "label": "2"},
        {"prompt": [{"role": "user", "content": "2+2 ?"}], "label": "4"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    write_jsonl(tmp_path / "d.jsonl", rows)
    kwargs = {"tokenizer": tokenizer, "apply_chat_template": True}
    assert load_prompts(tmp_path / "d.parquet", **kwargs) == load_prompts(
        tmp_path / "d.jsonl", **kwargs
    )
    pq.write_table(pa.Table.from_pylist([{"prompt": "a"}]), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n\.parquet:row 1: missing key 'label'"):
        load_prompts(tmp_path / "n.parquet")


def test_sequential_batches_cross_epochs() -> None:
    source = RolloutDataSource(numbered(5))
    assert [s.index for s in source.next_batch(3)] == [0, 1, 2]
    assert [s.index for s in source.next_batch(3)] == [3, 4, 0]
    assert source.cursor.state_dict() == {"epoch": 1, "offset": 1}
    assert [s.index for s in source.next_batch(12)] == [1, 2, 3, 4, *range(5), 0, 1, 2]


def test_shuffle_is_a_fixed_permutation_per_seed_and_epoch() -> None:
    source = RolloutDataSource(numbered(50), shuffle=True, seed=7)
    first, second = source.order(0), source.order(1)
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second != list(range(50))
    assert first == RolloutDataSource(numbered(50), shuffle=True, seed=7).order(0)
    assert first != RolloutDataSource(numbered(50), shuffle=True, seed=8).order(0)


def test_resume_neither_repeats_nor_skips() -> None:
    reference = RolloutDataSource(numbered(7), shuffle=True, seed=3)
    straight = [s.index for _ in range(6) for s in reference.next_batch(3)]

    first = RolloutDataSource(numbered(7), shuffle=True, seed=3)
    seen = [s.index for _ in range(4) for s in first.next_batch(3)]
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    resumed = RolloutDataSource(numbered(7), shuffle=True, seed=3)
    resumed.load_state_dict(state)
    seen += [s.index for _ in range(2) for s in resumed.next_batch(3)]

    assert seen == straight
    # 18 prompts = two full epochs of 7 (each prompt twice) + 4 of the third epoch
    assert sorted(seen[:7]) == sorted(seen[7:14]) == list(range(7))
    assert len(set(seen[14:])) == 4


def test_resume_rejects_another_data_set() -> None:
    source = RolloutDataSource(numbered(4), shuffle=True, seed=1)
    state = source.state_dict()
    with pytest.raises(DataError, match="taken on 4 prompts"):
        RolloutDataSource(numbered(5), shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="taken on 4 prompts"):
        RolloutDataSource(numbered(4), shuffle=True, seed=2).load_state_dict(state)


def test_num_rollouts_for_epochs() -> None:
    assert num_rollouts_for_epochs(17_000, 8, 2) == 4250
    assert num_rollouts_for_epochs(10, 4, 1) == 2
    assert num_rollouts_for_epochs(3, 8, 1) == 1


def test_sources_from_args(tmp_path: Path, tokenizer) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"q": f"{i}", "a": str(i)} for i in range(6)])
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"q": "1+1 ?", "a": "2"}])
    args = parse_args(
        [
            "--hf-checkpoint", "m", "--prompt-data", str(train), "--input-key", "q",
            "--label-key", "a", "--apply-chat-template", "--rollout-shuffle", "--seed", "5",
            "--eval-prompt-data", "tiny", str(evals),
        ]
    )  # fmt: skip
    source = rollout_source(args, tokenizer)
    assert len(source) == 6 and source.shuffle and source.seed == 5
    assert source.samples[0].prompt == "<|im_start|>user 0 <|im_end|> <|im_start|>assistant "
    sets = eval_sets(args, tokenizer)
    assert list(sets) == ["tiny"] and sets["tiny"][0].label == "2"


def test_chat_template_kwargs_reach_the_template(tmp_path: Path, tokenizer) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "what is 1+1 ?", "label": "2"}])
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = CHAT_TEMPLATE + "{% if enable_thinking is false %}be{% endif %}"
    argv = ["--hf-checkpoint", "m", "--prompt-data", str(path), "--apply-chat-template"]
    plain = rollout_source(parse_args(argv), tokenizer).samples[0].prompt
    thinking_off = ["--apply-chat-template-kwargs", '{"enable_thinking": false}']
    off = rollout_source(parse_args([*argv, *thinking_off]), tokenizer).samples[0]
    assert off.prompt == plain + "be"
