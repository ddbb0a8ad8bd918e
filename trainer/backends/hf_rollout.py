"""Portable rollout engine: transformers generation with per-token log-probabilities.

The log-probability of each sampled token is taken during generation (no second forward pass)
from the model's raw logits divided by the sampling temperature, ``log_softmax(logits / T)``,
before top-p/top-k truncation: the definition the policy trainer uses, so
`train_rollout_logprob_abs_diff` measures the numerical drift between generation (KV cache,
left padding) and training, never a difference of definitions. Only one step of logits is kept
at a time. Sampling uses exactly the given parameters, never the model's generation defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from trainer.backends.base import Generation, LoraAdapter, SamplingParams
from trainer.backends.devices import empty_cache, torch_dtype


class _SampledLogprobs:
    """A logits processor (placed before the sampling warpers, so it sees raw logits) that
    keeps ``log_softmax(logits / T)`` of the current step and, one step later, gathers the
    log-probability of the token that was sampled from it."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature
        self.previous: Any = None
        self.steps: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.previous = (scores.float() / self.temperature).log_softmax(-1)
        return scores

    def finish(self, new_tokens: Any) -> Any:
        """[rows, new tokens] log-probabilities, given the generated tokens."""
        import torch

        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, new_tokens[:, -1:]).squeeze(-1))
            self.previous = None
        return torch.stack(self.steps, dim=1)


class HFRolloutEngine:
    """A transformers causal LM that samples responses; LoRA adapters arrive in memory."""

    def __init__(self, model_path: str, *, device: str = "cpu", dtype: str = "fp32") -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype))
        self.model.to(self.device).eval()
        generation = self.model.generation_config
        eos = generation.eos_token_id if generation.eos_token_id is not None else []
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        pad = generation.pad_token_id
        self.pad_id: int = pad if pad is not None else min(self.eos_ids, default=0)
        # generate() fills unset fields from the model's generation config (a checkpoint's
        # top_k, repetition_penalty, ...): keep only what ends a sequence.
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id
        )
        self.adapter_version: int | None = None

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        if not prompts:
            return []
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        if params.seed is not None:
            torch.manual_seed(params.request_seed(0))
        greedy = params.temperature <= 0
        recorder = _SampledLogprobs(1.0 if greedy else params.temperature)
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None if greedy else max(params.top_k, 0),  # 0: off (unset means 50)
            max_new_tokens=params.max_new_tokens,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id,
        )
        with torch.no_grad():
            sequences = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
            )
        new_tokens = sequences[:, width:]
        logprobs = recorder.finish(new_tokens).cpu()
        new_tokens = new_tokens.cpu()
        return [
            self._generation(prompt, new_tokens[row].tolist(), logprobs[row].tolist(), params)
            for row, prompt in enumerate(prompts)
        ]

    def _generation(
        self,
        prompt: Sequence[int],
        tokens: list[int],
        logprobs: list[float],
        params: SamplingParams,
    ) -> Generation:
        end = next((i + 1 for i, token in enumerate(tokens) if token in self.eos_ids), None)
        length = end if end is not None else len(tokens)
        return Generation(
            prompt_ids=tuple(prompt),
            response_ids=tuple(tokens[:length]),
            response_logprobs=tuple(logprobs[:length]),
            truncated=end is None and length >= params.max_new_tokens,
        )

    def load_adapter(self, adapter: LoraAdapter) -> None:
        from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        if not isinstance(self.model, PeftModel):
            config = LoraConfig.from_peft_type(**dict(adapter.config))
            self.model = get_peft_model(self.model, config).eval()
        tensors = {name: tensor.to(self.device) for name, tensor in adapter.tensors.items()}
        result = set_peft_model_state_dict(self.model, tensors)
        if result.unexpected_keys:
            raise ValueError(f"adapter tensors the model lacks: {result.unexpected_keys[:3]}")
        self.adapter_version = adapter.version

    def score(self, token_ids: Sequence[int]) -> list[list[float]]:
        import torch

        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        with torch.no_grad():
            logits = self.model(input_ids=ids).logits[0, :-1].float()
        logprobs = logits.log_softmax(-1).gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        return [logprobs.cpu().tolist()]

    def release_memory(self) -> None:
        if self.device.type != "cpu":
            self.model.to("cpu")
            empty_cache(self.device)

    def resume_memory(self) -> None:
        if self.device.type != "cpu":
            self.model.to(self.device)


def create(args: argparse.Namespace, device: str, *, engine_index: int = 0) -> HFRolloutEngine:
    """The ``--rollout-backend hf`` factory (see `trainer.backends.registry`). Every engine
    samples from its requests' own seeds, so `engine_index` changes nothing here."""
    from trainer.arguments import resolve_dtype

    return HFRolloutEngine(args.hf_checkpoint, device=device, dtype=resolve_dtype(args, device))
