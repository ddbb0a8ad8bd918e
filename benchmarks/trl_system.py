"""`benchmarks/grpo_vs_trl.py`'s TRL-driven systems: `trl` (transformers generates), `trl-vllm`
(vLLM colocated) and `unsloth` (Unsloth's fast_inference vLLM and its patched GRPOTrainer),
with the same workload as the others."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.peak_memory import PeakMemory, synchronize
from benchmarks.workload import (
    TARGETS,
    Spec,
    StepTime,
    build_tokenizer,
    package_versions,
    prompts_of,
)
from trainer.tiny import parity

# what each system's vLLM engine takes of the GPU where `--vllm-memory` is not given
UNSLOTH_VLLM_MEMORY = 0.5  # FastLanguageModel.from_pretrained's default
# the phase within a TRL-driven rollout that hands the adapter to vLLM
ADAPTER_PHASE = {"trl-vllm": "sync_weights", "unsloth": "load_lora"}


def trl_config(spec: Spec, steps: int, kind: str) -> Any:
    """The GRPOConfig of `kind` ("trl", "trl-vllm" or "unsloth"): the same workload, generated
    by transformers or by vLLM colocated (grpo_vs_trl.py's docstring). For "unsloth", TRL's
    GRPOConfig as importing Unsloth patches it: vLLM is the model's own `fast_inference`
    engine, which Unsloth sizes and never puts to sleep."""
    from trl import GRPOConfig

    cuda = spec.device.startswith("cuda")
    rows = spec.prompts * spec.samples
    accumulation = rows // spec.micro_batch
    if kind in ADAPTER_PHASE:
        eos = build_tokenizer(spec, eos=True).eos_token_id
        generation: dict[str, Any] = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_enable_sleep_mode": spec.vllm_sleep and kind == "trl-vllm",
            "generation_kwargs": {"min_tokens": spec.response_len, "stop_token_ids": [eos]},
        }
        if kind == "trl-vllm" and spec.vllm_memory is not None:
            generation["vllm_gpu_memory_utilization"] = spec.vllm_memory
    else:
        generation = {"use_vllm": False, "generation_kwargs": {"min_new_tokens": spec.response_len}}
    return GRPOConfig(
        output_dir=str(Path(spec.work) / "trl"),
        learning_rate=spec.lr,
        per_device_train_batch_size=spec.micro_batch,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_iterations=1,
        num_generations=spec.samples,
        max_completion_length=spec.response_len,
        temperature=1.0,
        beta=0.0,
        bf16=cuda,
        gradient_checkpointing=spec.gradient_checkpointing and kind != "unsloth",
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=spec.seed,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        **generation,
    )


def unsloth_model_kwargs(spec: Spec) -> dict[str, Any]:
    """`FastLanguageModel.from_pretrained`'s arguments: the random-weight model in bf16, not
    quantized, vLLM in process (`fast_inference`) for rank-64 adapters. `fix_tokenizer` off: the
    word-level tokenizer is complete as built (pad set, no EOS by design), nothing to repair."""
    import torch

    return {
        "model_name": spec.model_dir,
        "max_seq_length": spec.prompt_len + spec.response_len,
        "dtype": torch.bfloat16,
        "load_in_4bit": False,
        "fast_inference": True,
        "max_lora_rank": 64,
        "gpu_memory_utilization": UNSLOTH_VLLM_MEMORY
        if spec.vllm_memory is None
        else spec.vllm_memory,
        "float8_kv_cache": spec.kv_cache_dtype == "fp8",  # vLLM's kv_cache_dtype "fp8"
        "fix_tokenizer": False,
        "random_state": spec.seed,
    }


def unsloth_lora_kwargs(spec: Spec) -> dict[str, Any]:
    """`FastLanguageModel.get_peft_model`'s arguments: the workload's adapter."""
    return {
        "r": 64,
        "lora_alpha": 32,
        "lora_dropout": 0.0,
        "target_modules": TARGETS,
        "bias": "none",
        "use_gradient_checkpointing": "unsloth" if spec.gradient_checkpointing else False,
        "random_state": spec.seed,
    }


def unsloth_model(spec: Spec) -> Any:
    """Unsloth's model with its adapter and its vLLM engine. Imported before TRL, as Unsloth
    asks: importing it patches TRL's GRPOTrainer and GRPOConfig."""
    from unsloth import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(**unsloth_model_kwargs(spec))
    return FastLanguageModel.get_peft_model(model, **unsloth_lora_kwargs(spec))


def run_trl(spec: Spec, kind: str, steps: int, conn: Any, memory: PeakMemory) -> None:
    """TRL's own training loop (for "unsloth", as Unsloth patches it), paced by the parent:
    each step waits for its "step" command."""
    model = unsloth_model(spec) if kind == "unsloth" else None
    import datasets
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    cuda = spec.device.startswith("cuda")
    tokenizer = build_tokenizer(spec, eos=True)
    tokenizer.padding_side = "left"
    dtype = torch.bfloat16 if cuda else torch.float32
    peft_config = None  # Unsloth's adapter is in place already
    if model is None:
        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=dtype).to(spec.device)
        peft_config = LoraConfig(
            r=64, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"
        )
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    dataset = datasets.Dataset.from_dict({"prompt": prompts_of(spec)})
    # a step's times; the adapter's hand-over may run before the first step (at start-up) too
    timing: dict[str, float] = {"sync": 0.0}

    class Pace(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            command = conn.recv()
            if command == "reset":
                memory.reset()
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                command = conn.recv()
            assert command == "step", command
            memory.watch()
            synchronize(spec.device)
            timing.update(started=time.perf_counter(), rollout=0.0, sync=0.0, responses=0)

        def on_step_end(self, *_: Any, **__: Any) -> None:
            synchronize(spec.device)
            rows = spec.prompts * spec.samples
            responses = int(timing["responses"])
            step = StepTime(
                step_s=time.perf_counter() - timing["started"],
                rollout_s=timing["rollout"] - timing["sync"],
                response_tokens=responses,
                total_tokens=responses + rows * spec.prompt_len,
                phases={ADAPTER_PHASE[kind]: timing["sync"]} if kind in ADAPTER_PHASE else {},
            )
            memory.pause()
            memory.idle()
            conn.send(asdict(step))

    def timed(call: Any, phase: str) -> Any:
        """`call` with its time (the device synchronized) added to the step's `phase`, and
        `memory`'s samples within it counted as the phase's."""
        name = ADAPTER_PHASE[kind] if phase == "sync" else phase  # as the step's phases say

        def run(*args: Any, **kwargs: Any) -> Any:
            with memory.phase(name):
                synchronize(spec.device)
                started = time.perf_counter()
                out = call(*args, **kwargs)
                synchronize(spec.device)
                timing[phase] += time.perf_counter() - started
            return out

        return run

    def length_parity(completions: list[str], **_: Any) -> list[float]:
        return [parity(completion) for completion in completions]

    if kind == "unsloth":  # within the rollout: Unsloth hands the adapter to vLLM
        model.load_lora = timed(model.load_lora, "sync")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=length_parity,
        args=trl_config(spec, steps, kind),
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[Pace()],
    )
    generate = timed(trainer._generate_single_turn, "rollout")  # model.generate, or vLLM's

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        out = generate(*args, **kwargs)
        timing["responses"] += sum(len(ids) for ids in out[0])
        return out

    trainer._generate_single_turn = timed_generate
    if kind == "trl-vllm":  # within the rollout: the adapter merged into vLLM's weights
        trainer.vllm_generation.sync_weights = timed(trainer.vllm_generation.sync_weights, "sync")
    trainer.remove_callback(PrinterCallback)  # TRL's per-step log dicts on stdout
    conn.send(("ready", package_versions()))
    trainer.train()
