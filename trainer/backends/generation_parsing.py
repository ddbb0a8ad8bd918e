"""SGLang ``Engine.generate`` requests and outputs: `SamplingParams` in, `Generation` out.

With ``return_logprob=True`` each output carries ``meta_info.output_token_logprobs``, a list of
``(logprob, token_id, text_or_None)`` per generated token, and ``meta_info.finish_reason``:
``{"type": "length", ...}`` (hit the token limit: truncated), ``{"type": "stop", ...}`` (EOS or
a stop token/string) or ``{"type": "abort", "message": ...}``. Format as of SGLang 0.5.9
(``TokenizerManager.detokenize_logprob_tokens``, ``schedule_batch.FINISH_*.to_json``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trainer.backends.base import Generation, SamplingParams


class GenerationError(RuntimeError):
    """An engine output that cannot be turned into a training sample."""


def sampling_params(params: SamplingParams, count: int) -> list[dict[str, Any]]:
    """``sampling_params`` for ``Engine.generate`` of `count` requests, one dict each (SGLang's
    ``SamplingParams`` fields; a temperature of 0 is greedy there, top_k -1 is off).

    SGLang seeds a request's sampler from its ``sampling_seed``; one seed for the whole batch
    would make the n samples of a prompt identical under deterministic inference, so each
    request gets its own (`SamplingParams.request_seed`).
    """
    shared: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
    }
    if params.stop:
        shared["stop"] = list(params.stop)
    if params.stop_token_ids:
        shared["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is None:
        return [dict(shared) for _ in range(count)]
    return [{**shared, "sampling_seed": params.request_seed(i)} for i in range(count)]


def parse_output(prompt_ids: Sequence[int], output: Mapping[str, Any]) -> Generation:
    meta = output.get("meta_info")
    if not isinstance(meta, Mapping):
        raise GenerationError("SGLang output has no meta_info")
    rid = meta.get("id", "?")
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, Mapping) else None
    if kind == "abort":
        raise GenerationError(f"SGLang aborted request {rid}: {finish.get('message')}")
    if kind not in ("length", "stop"):
        raise GenerationError(f"request {rid}: unexpected finish_reason {finish!r}")
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise GenerationError(
            f"request {rid}: no output_token_logprobs (generate needs return_logprob=True)"
        )
    token_ids: list[int] = []
    logprobs: list[float] = []
    for position, entry in enumerate(entries):
        if len(entry) < 2 or entry[0] is None or entry[1] is None:
            raise GenerationError(f"request {rid}: malformed logprob entry {position}: {entry!r}")
        logprobs.append(float(entry[0]))
        token_ids.append(int(entry[1]))
    output_ids = output.get("output_ids")
    if output_ids is not None and list(output_ids) != token_ids:
        raise GenerationError(f"request {rid}: output_ids disagree with output_token_logprobs")
    completion = meta.get("completion_tokens")
    if completion is not None and completion != len(token_ids):
        raise GenerationError(
            f"request {rid}: {completion} completion tokens but {len(token_ids)} logprobs"
        )
    return Generation(
        prompt_ids=tuple(prompt_ids),
        response_ids=tuple(token_ids),
        response_logprobs=tuple(logprobs),
        truncated=kind == "length",
    )


def parse_outputs(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Mapping[str, Any]] | Mapping[str, Any]
) -> list[Generation]:
    """One `Generation` per prompt; a single-prompt call may return a bare dict."""
    if isinstance(outputs, Mapping):
        outputs = [outputs]
    if len(outputs) != len(prompts):
        raise GenerationError(f"{len(prompts)} prompts but {len(outputs)} SGLang outputs")
    return [parse_output(p, o) for p, o in zip(prompts, outputs, strict=True)]


def parse_input_logprobs(
    token_ids: Sequence[int], output: Mapping[str, Any], vocab_size: int
) -> list[float]:
    """Log-probabilities of ``token_ids[1:]`` from a prefill with ``return_logprob=True`` and
    ``logprob_start_len=0``: ``meta_info.input_token_logprobs`` holds one ``(logprob, token_id,
    text)`` per input token, the first without a log-probability (nothing precedes it).

    SGLang reports every input id from ``vocab_size - 1`` on as 0 (it clips image tokens' hash
    ids: ``SchedulerLogprobResultProcessor._process_input_token_logprobs``, 0.5.17), so a real
    last-vocabulary token comes back as 0 and is accepted as such."""
    meta = output.get("meta_info")
    entries = meta.get("input_token_logprobs") if isinstance(meta, Mapping) else None
    if entries is None or len(entries) != len(token_ids):
        count = "none" if entries is None else len(entries)
        raise GenerationError(
            f"expected {len(token_ids)} input_token_logprobs (logprob_start_len=0), got {count}"
        )
    for position, (entry, token) in enumerate(zip(entries, token_ids, strict=True)):
        reported = token if token < vocab_size - 1 else 0
        if len(entry) < 2 or int(entry[1]) != reported or (position and entry[0] is None):
            raise GenerationError(
                f"malformed input logprob entry {position}: {entry!r} (the input has token "
                f"{token} there; entries {position - 2}..{position + 2}: "
                f"{[tuple(e[:2]) for e in entries[max(position - 2, 0) : position + 3]]})"
            )
    return [float(entry[0]) for entry in entries[1:]]
