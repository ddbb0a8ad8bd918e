"""Portable rollout engine: transformers generation with per-token log-probabilities.

The log-probability of each sampled token is taken during generation (no second forward pass)
from the model's raw logits divided by the sampling temperature, ``log_softmax(logits / T)``,
before top-p/top-k truncation: the definition the policy trainer uses, so
`train_rollout_logprob_abs_diff` measures the numerical drift between generation (KV cache,
left padding) and training, never a difference of definitions. Only one step of logits is kept
at a time. Sampling uses exactly the given parameters, never the model's generation defaults.

Each sample draws from its own generator, seeded from its request seed: the n samples
of one prompt always differ in their randomness, and a sample does not depend on the batch it
shares. Without a seed, the row seeds come from torch's global generator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainer.backends.base import Generation, LoraAdapter, SamplingParams
from trainer.backends.devices import empty_cache, torch_dtype
from trainer.backends.lora_merge import LoraMerger

if TYPE_CHECKING:
    import torch

    from trainer.config import TrainConfig


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


def row_seeds(params: SamplingParams, rows: int) -> list[int]:
    """One seed per sample: its request seed (`SamplingParams.request_seed`, distinct over every
    engine of a batch) mixed by numpy's SeedSequence, or drawn at random without a seed."""
    import numpy as np
    import torch

    if params.seed is None:
        return [int(s) for s in torch.randint(0, 2**62, (rows,))]
    return [
        int(np.random.SeedSequence(params.request_seed(row)).generate_state(1)[0])
        for row in range(rows)
    ]


class _PerRowSampler:
    """The last logits processor: applies temperature, top-k and top-p (transformers' warpers),
    samples each row's next token with that row's own generator, and leaves only that token
    possible, so generation proceeds greedily over the sampled tokens."""

    def __init__(self, params: SamplingParams, seeds: Sequence[int], device: Any) -> None:
        import torch
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.generators = [torch.Generator(device).manual_seed(seed) for seed in seeds]
        warpers: list[Any] = [TemperatureLogitsWarper(params.temperature)]
        if params.top_k > 0:
            warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(params.top_p))
        self.warpers = LogitsProcessorList(warpers)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = self.warpers(input_ids, scores).float().softmax(-1)
        tokens = torch.stack(
            [
                torch.multinomial(row, 1, generator=g)
                for row, g in zip(probs, self.generators, strict=True)
            ]
        )
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens, 0.0)


class _StopStrings:
    """A stopping criterion: a row is done once the text of its last new tokens (as many as the
    longest stop string has characters) contains a stop string; remembers after how many new
    tokens each row first stopped (rows that stopped are padded from then on)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.tail = max(len(stop) for stop in self.stops)
        self.prompt_width = prompt_width
        self.ends: dict[int, int] = {}

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        produced = input_ids.shape[1] - self.prompt_width
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for row in range(input_ids.shape[0]):
            if row in self.ends:
                done[row] = True
                continue
            tail = input_ids[row, max(self.prompt_width, input_ids.shape[1] - self.tail) :]
            text = self.tokenizer.decode(tail.tolist(), skip_special_tokens=True)
            if any(stop in text for stop in self.stops):
                self.ends[row] = produced
                done[row] = True
        return done


class HFRolloutEngine:
    """A transformers causal LM that samples responses; LoRA adapters arrive in memory. With
    `merged` each adapter is merged into the model's own linear weights (`lora_merge`) instead
    of being served through PEFT."""

    def __init__(
        self, model_path: str, *, device: str = "cpu", dtype: str = "fp32", merged: bool = False
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype))
        self.model.to(self.device).eval()
        self.merger = (
            LoraMerger.from_checkpoint(model_path, device=self.device, dtype=torch_dtype(dtype))
            if merged
            else None
        )
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
        self.model_path = model_path
        self.adapter_version: int | None = None
        self._tokenizer: Any = None
        self._released = False

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        if not prompts:
            return []
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        greedy = params.temperature <= 0
        recorder = _SampledLogprobs(1.0 if greedy else params.temperature)
        processors: list[Any] = [recorder]
        if not greedy:
            seeds = row_seeds(params, len(prompts))
            processors.append(_PerRowSampler(params, seeds, self.device))
        config = GenerationConfig(
            do_sample=False,  # sampling happens in _PerRowSampler
            max_new_tokens=params.max_new_tokens,
            eos_token_id=sorted(self.eos_ids | set(params.stop_token_ids)),
            pad_token_id=self.pad_id,
        )
        stop_strings = _StopStrings(self.tokenizer(), params.stop, width) if params.stop else None
        with torch.no_grad():
            sequences = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                generation_config=config,
                logits_processor=LogitsProcessorList(processors),
                stopping_criteria=StoppingCriteriaList([stop_strings] if stop_strings else []),
            )
        new_tokens = sequences[:, width:]
        logprobs = recorder.finish(new_tokens).cpu()
        new_tokens = new_tokens.cpu()
        ends = stop_strings.ends if stop_strings else {}
        return [
            self._generation(
                prompt, new_tokens[row].tolist(), logprobs[row].tolist(), params, ends.get(row)
            )
            for row, prompt in enumerate(prompts)
        ]

    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer, loaded on first use (stop strings need it)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def _generation(
        self,
        prompt: Sequence[int],
        tokens: list[int],
        logprobs: list[float],
        params: SamplingParams,
        stop_string_end: int | None = None,
    ) -> Generation:
        stops = self.eos_ids | set(params.stop_token_ids)
        end = next((i + 1 for i, token in enumerate(tokens) if token in stops), None)
        if stop_string_end is not None:
            end = stop_string_end if end is None else min(end, stop_string_end)
        length = end if end is not None else len(tokens)
        return Generation(
            prompt_ids=tuple(prompt),
            response_ids=tuple(tokens[:length]),
            response_logprobs=tuple(logprobs[:length]),
            truncated=end is None and length >= params.max_new_tokens,
        )

    def borrow_base(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Merge into the trainer's base weights on this device (`shared_base`) instead of a
        copy read from the checkpoint."""
        if self.merger is None:
            raise ValueError("an engine serving the adapter merges nothing: it borrows no base")
        self.merger.borrow(weights)

    def load_adapter(self, adapter: LoraAdapter) -> None:
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

        if self.merger is not None:
            self._load_merged(adapter)
            return
        if not isinstance(self.model, PeftModel):
            config = LoraConfig.from_peft_type(**dict(adapter.config))
            # PEFT initialises the new layers from the process's random state, which the
            # adapter's tensors then replace: draw from a fork of it, or an engine sharing a
            # process with the trainer would move the trainer's random stream at its first
            # adapter, a point where a resumed run is not (its dropout would differ)
            with torch.random.fork_rng(devices=self._cuda_indices()):
                # the adapter in the model's dtype, as SGLang serves it and the trainer
                # computes it
                self.model = get_peft_model(self.model, config, autocast_adapter_dtype=False)
            self.model.eval()
        tensors = {name: tensor.to(self.device) for name, tensor in adapter.tensors.items()}
        result = set_peft_model_state_dict(self.model, tensors)
        if result.unexpected_keys:
            raise ValueError(f"adapter tensors the model lacks: {result.unexpected_keys[:3]}")
        missing = [key for key in result.missing_keys if ".lora_" in key]
        if missing:
            raise ValueError(f"adapter lacks {len(missing)} LoRA tensor(s), e.g. {missing[:3]}")
        self.adapter_version = adapter.version

    def _cuda_indices(self) -> list[int]:
        import torch

        if self.device.type != "cuda":
            return []
        return [self.device.index if self.device.index is not None else torch.cuda.current_device()]

    def _load_merged(self, adapter: LoraAdapter) -> None:
        import torch

        merged = self.merger.merge(adapter)
        with torch.no_grad():
            for name, weight in merged.items():
                self.model.get_parameter(name).copy_(weight)
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
            if self.merger is not None:
                self.merger.release()
            empty_cache(self.device)
            self._released = True

    def resume_weights(self) -> None:
        """The model back on the device: all this engine holds there (no KV cache is kept
        between calls), so `resume_memory` after it has nothing left to do."""
        if self._released:
            self.model.to(self.device)
            if self.merger is not None:
                self.merger.restore()
            self._released = False

    def resume_memory(self) -> None:
        self.resume_weights()


def create(config: TrainConfig, device: str, *, engine_index: int = 0) -> HFRolloutEngine:
    """The ``--rollout-backend hf`` factory (see `trainer.backends.registry`). Every engine
    samples from its requests' own seeds, so `engine_index` changes nothing here."""
    return HFRolloutEngine(
        config.checkpoint.hf_checkpoint,
        device=device,
        dtype=config.placement.resolve_dtype(device),
        merged=config.lora.merged,
    )
