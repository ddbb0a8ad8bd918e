"""Parsing SGLang generate outputs (meta_info.output_token_logprobs, finish_reason)."""

from __future__ import annotations

import sys

import pytest

from trainer.backends.base import Generation, SamplingParams
from trainer.backends.generation_parsing import (
    GenerationError,
    parse_input_logprobs,
    parse_output,
    parse_outputs,
    sampling_params,
)


def _output(tokens, finish, *, logprobs=None, with_ids=True, text=None) -> dict:
    logprobs = logprobs or [-0.5 * (i + 1) for i in range(len(tokens))]
    meta = {
        "id": "req-1",
        "finish_reason": finish,
        "prompt_tokens": 3,
        "completion_tokens": len(tokens),
        "output_token_logprobs": [(lp, t, text) for lp, t in zip(logprobs, tokens, strict=True)],
    }
    out = {"text": "ignored", "meta_info": meta}
    if with_ids:
        out["output_ids"] = list(tokens)
    return out


def test_stop_gives_an_untruncated_generation() -> None:
    out = _output([11, 12, 2], {"type": "stop", "matched": 2})
    assert parse_output([1, 5, 7], out) == Generation(
        prompt_ids=(1, 5, 7),
        response_ids=(11, 12, 2),
        response_logprobs=(-0.5, -1.0, -1.5),
        truncated=False,
    )


def test_length_marks_truncation_and_text_entries_are_accepted() -> None:
    out = _output([4, 4], {"type": "length", "length": 2}, with_ids=False, text="a")
    generation = parse_output([1], out)
    assert generation.truncated is True
    assert generation.response_ids == (4, 4)


def test_batch_and_single_dict_outputs() -> None:
    outs = [_output([3], {"type": "stop", "matched": 3}), _output([9], {"type": "length"})]
    assert [g.truncated for g in parse_outputs([[1], [2]], outs)] == [False, True]
    assert len(parse_outputs([[1]], outs[0])) == 1
    with pytest.raises(GenerationError, match="2 prompts but 1 SGLang outputs"):
        parse_outputs([[1], [2]], [outs[0]])


def test_empty_response_is_valid() -> None:
    assert parse_output([1], _output([], {"type": "length", "length": 0})).response_ids == ()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("meta_info"), "no meta_info"),
        (lambda o: o["meta_info"].update(finish_reason=None), "unexpected finish_reason None"),
        (
            lambda o: o["meta_info"].update(finish_reason={"type": "abort", "message": "oom"}),
            "aborted request req-1: oom",
        ),
        (lambda o: o["meta_info"].pop("output_token_logprobs"), "return_logprob=True"),
        (lambda o: o["meta_info"]["output_token_logprobs"].__setitem__(0, (None, 5, None)),
         "malformed logprob entry 0"),
        (lambda o: o.update(output_ids=[5, 7]), "output_ids disagree"),
        (lambda o: o["meta_info"].update(completion_tokens=7), "7 completion tokens but 2"),
    ],
)  # fmt: skip
def test_malformed_outputs_are_rejected(mutate, message: str) -> None:
    out = _output([5, 6], {"type": "stop", "matched": 6})
    mutate(out)
    with pytest.raises(GenerationError, match=message):
        parse_output([1], out)


def test_sampling_params_use_sglang_field_names() -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0.7, top_k=20)
    assert (
        sampling_params(params, 2)
        == [{"max_new_tokens": 8, "temperature": 0.7, "top_p": 1.0, "top_k": 20}] * 2
    )


def test_stop_strings_and_token_ids_reach_sglang() -> None:
    params = SamplingParams(8, stop=("</answer>",), stop_token_ids=(7, 9))
    [request] = sampling_params(params, 1)
    assert request["stop"] == ["</answer>"] and request["stop_token_ids"] == [7, 9]


@pytest.mark.parametrize("seed", [0, 3, 2**40])
def test_every_request_gets_its_own_seed(seed: int) -> None:
    """Under deterministic sampling one seed per call gives the n samples of a prompt the same
    tokens (zero advantage); each request needs its own."""
    prompts_times_n = 16
    seeds = [p["sampling_seed"] for p in sampling_params(SamplingParams(1, seed=seed), 16)]
    assert len(set(seeds)) == prompts_times_n


def test_request_seeds_stay_distinct_across_engines_and_calls() -> None:
    """A batch split over engines (first_request) and consecutive rollouts (seed) never
    reuse a request seed."""
    seen = []
    for seed in (7, 8):  # two rollouts
        for first in (0, 5):  # two engines, 5 requests each
            params = SamplingParams(1, seed=seed, first_request=first)
            seen += [p["sampling_seed"] for p in sampling_params(params, 5)]
    assert len(set(seen)) == len(seen) == 20


def test_input_logprobs_of_a_prefill() -> None:
    output = {"meta_info": {"input_token_logprobs": [[None, 5, None], [-0.5, 6, None], [-1.5, 7]]}}
    assert parse_input_logprobs([5, 6, 7], output, vocab_size=16) == [-0.5, -1.5]
    with pytest.raises(GenerationError, match="expected 2 input_token_logprobs"):
        parse_input_logprobs([5, 6], output, vocab_size=16)
    with pytest.raises(GenerationError, match="malformed input logprob entry 1"):
        parse_input_logprobs([5, 9, 7], output, vocab_size=16)


def test_input_logprobs_of_the_last_vocabulary_token() -> None:
    """SGLang reports input ids from vocab_size - 1 on as 0; the H200 production run's probe
    sequence held the tiny vocabulary's last token (15) and was refused as malformed."""
    output = {"meta_info": {"input_token_logprobs": [[None, 5, None], [-3.0, 0, None]]}}
    assert parse_input_logprobs([5, 15], output, vocab_size=16) == [-3.0]
    with pytest.raises(GenerationError, match="the input has token 14 there"):
        parse_input_logprobs([5, 14], output, vocab_size=16)


def test_heavy_packages_not_imported() -> None:
    assert not any(m == "sglang" or m.startswith(("sglang.", "megatron")) for m in sys.modules)
