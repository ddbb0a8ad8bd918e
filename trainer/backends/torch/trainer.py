"""Portable policy trainer: PEFT LoRA on a transformers causal LM, AdamW, micro-batches.

The reference policy is the same model with its adapter disabled (no second copy). Log-
probabilities are ``log_softmax(logits / temperature)``, the rollout engine's definition, taken
for the tokens under ``loss_mask`` only (0 elsewhere): the output layer runs on those positions,
a chunk of rows at a time (`trainer.grpo.logprobs`), so no ``[tokens, vocab]`` tensor is built.
With several data-parallel ranks (torch.distributed initialised by the caller), gradients are
averaged over ranks before clipping; every rank holds the same weights.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.backends.base import ForwardOutput, LoraAdapter, LossFn, StepResult, TrainBatch
from trainer.backends.devices import torch_dtype
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.frozen_weights import FrozenWeights, OptimizerState
from trainer.backends.torch.targets import peft_lora_config
from trainer.errors import first_line
from trainer.run.checkpoint import ADAPTER_DIR, CheckpointError

if TYPE_CHECKING:
    import torch

    from trainer.config import LoraConfig, OptimizerConfig, TrainConfig

# ``trainer_state.json`` and ``trainer_state.safetensors`` (`trainer.run.tensor_state`)
STATE_STEM = "trainer_state"
# Config fields of causal LMs whose logits are more than ``last_hidden_state @ lm_head.weight.T``
# (those take the full logits from the model's own forward).
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
# compiles of the decoder layers' code before dynamo runs it eagerly: each kind of pass twice
# (`_compile_decoder_layers`), and once more for a micro-batch of another size, with room
RECOMPILE_LIMIT = 32


def lr_factor(optim: OptimizerConfig, total_iters: int, step: int) -> float:
    """Multiplier of ``--lr`` at optimizer step `step` (0-based) of `total_iters`: warmup, then
    ``--lr-decay-style`` down to ``--min-lr``."""
    warmup = optim.lr_warmup_iters
    if step < warmup:
        return (step + 1) / warmup
    if optim.lr_decay_style == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total_iters - warmup))
    floor = optim.min_lr / optim.lr if optim.lr > 0 else 0.0
    if optim.lr_decay_style == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _json_safe(config: dict[str, Any]) -> dict[str, Any]:
    safe: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, set):
            value = sorted(value)
        elif hasattr(value, "value") and isinstance(value, str):
            value = value.value
        safe[key] = value
    return safe


def _sort_sets(config: Any) -> None:
    """Sets in PEFT's LoRA config (``all-linear`` resolves to a set of module names) become
    sorted lists: a set is saved in ``adapter_config.json`` in an order that changes with each
    process's hash seed, so a resumed run's adapter would differ from the uninterrupted run's.
    PEFT matches module names against a list as against a set."""
    for field in fields(config):
        value = getattr(config, field.name)
        if isinstance(value, set):
            setattr(config, field.name, sorted(value))


def _enable_activation_checkpointing(model: Any, layers: int = -1) -> None:
    """Non-reentrant checkpointing of the first `layers` decoder layers (-1: every one; the
    others keep their activations for backward, as Megatron's block recompute method does).
    Transformers 5 renamed the call; it switches every layer on, each layer's own
    ``gradient_checkpointing`` then switches the rest off."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if layers == -1:
        return
    decoder_layers = getattr(model.get_decoder(), "layers", None)
    if decoder_layers is None:
        raise ValueError(
            f"--gradient-checkpointing-layers: {type(model).__name__} has no list of decoder "
            "layers to choose from; run without it"
        )
    for layer in decoder_layers[layers:]:
        layer.gradient_checkpointing = False


@dataclass(frozen=True)
class Layout:
    """Where a micro-batch's tokens are, known on the host before its forward: on a GPU,
    finding either from the device's copy of the masks would make the host wait for the
    device, micro-batch after micro-batch."""

    where: tuple[Any, Any]  # rows and columns of the loss tokens, on the trainer's device
    # every row is its tokens then padding (`trainer.batching.pack`): causal attention alone
    # keeps each token from the padding after it, so the model runs without the padding mask
    causal_only: bool


def _causal_masks(config: Any) -> dict[str, None] | None:
    """The ``attention_mask`` that makes a transformers model attend causally alone: a mask
    per layer type, none, where every layer attends fully (transformers then builds no mask,
    and reads nothing of the device to decide so); else None (it builds its masks, sliding
    windows included, from the positions)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types and set(layer_types) == {"full_attention"}:
        return {"full_attention": None}
    return None


def _compile_decoder_layers(model: Any) -> None:
    """`torch.compile` each decoder layer of `model` (regional compilation, as Unsloth compiles
    its models: the layers share one code object, so one graph serves them all). Under
    activation checkpointing, transformers' checkpoint wraps the compiled call, and dynamo
    compiles the checkpoint with the layer if it may leave transformers' output-capturing
    context variable unreplayed in the recompute (nothing here captures outputs); it would
    otherwise run every layer eagerly.

    Each kind of pass (training, log-probabilities with and without the adapter, the first
    layer's input needing a gradient or not) compiles for its first length, then once more
    dynamic in what changed (dynamo's automatic dynamic shapes): 9 graphs with checkpointing,
    merged, where dynamo's limit of 8 per code object would leave the last kind, training,
    eager; hence `RECOMPILE_LIMIT`. Dynamic from the first compile (``dynamic=True``) would
    make 5, but with every dimension symbolic its train phase took 3.5% longer and its warm-up
    35 s more (benchmarks/results/2026-12-06-h100-p-compile-dynamic.md)."""
    import torch

    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"--torch-compile-layers: {type(model).__name__} has no list of decoder layers to "
            "compile; run without it"
        )
    config = torch._dynamo.config
    config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
    for layer in layers:
        layer.compile()


def _scatter(shape: Any, where: tuple[Any, Any], values: Any) -> Any:
    """`values` (one per position of `where`) into a zero tensor of `shape`."""
    import torch

    return torch.zeros(shape, dtype=values.dtype, device=values.device).index_put(where, values)


def _plain_head(base: Any) -> bool:
    """Whether the output layer is a plain bias-free Linear with no logit transform, which the
    log-prob computation applies itself chunk by chunk; a LoRA-wrapped or biased one goes
    through the model's own forward."""
    import torch

    head = base.get_output_embeddings()
    return (
        type(head) is torch.nn.Linear
        and head.bias is None
        and not any(
            getattr(base.config, name, None) not in (None, 1.0) for name in LOGIT_TRANSFORMS
        )
    )


def _adamw(params: list[Any], optim: OptimizerConfig, total_steps: int) -> tuple[Any, Any]:
    """AdamW over `params` with the run's LR schedule (`lr_factor`) of `total_steps` steps."""
    import torch

    optimizer = torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        eps=optim.adam_eps,
        weight_decay=optim.weight_decay,
    )
    schedule = functools.partial(lr_factor, optim, total_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


class PeftPolicyTrainer:
    def __init__(
        self,
        model_path: str,
        lora: LoraConfig,
        optim: OptimizerConfig,
        *,
        total_steps: int,
        device: str = "cpu",
        dtype: str = "fp32",
        temperature: float = 1.0,
        entropy_grad: bool = False,
        gradient_checkpointing: bool = False,
        checkpointed_layers: int = -1,
        logprob_chunk_rows: int = -1,
        base_cpu_backup: bool = False,
        merged: bool = False,
        keep_merged_weights: bool = True,
        compile_layers: bool = False,
        seed: int = 0,
    ) -> None:
        """`total_steps`: optimizer steps of the run (the LR schedule's length).
        `base_cpu_backup`: colocated, free the base weights' and the optimizer state's GPU
        memory during rollouts (``--lora-base-cpu-backup``, `trainer.backends.frozen_weights`).
        `gradient_checkpointing`: recompute each decoder layer's activations in backward
        (less memory for long sequences, about a third more compute); `checkpointed_layers`:
        only the first that many (``--gradient-checkpointing-layers``; -1: all; 0: none, and
        transformers' checkpointing hooks stay off).
        `logprob_chunk_rows`: response tokens per chunk of the log-prob computation
        (``--log-probs-chunk-size``; -1: `trainer.grpo.logprob_chunks.DEFAULT_CHUNK_ROWS`).
        `merged`: the engines serve the adapter merged (``--lora-serving merged``), so the
        policy trained is the merged one (`trainer.backends.torch.merged_policy`).
        `keep_merged_weights`: merged, each layer merges once per optimizer step and keeps that
        copy for the step's passes (`MergedPolicy.weights_kept`), else it merges again in every
        pass.
        `compile_layers` (``--torch-compile-layers``): each decoder layer compiled
        (`_compile_decoder_layers`), and each chunk of the log-probabilities
        (`trainer.grpo.logprobs`'s ``compiled``)."""
        import torch
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM

        from trainer.backends.torch.merged_policy import MergedPolicy
        from trainer.grpo.logprob_chunks import chunk_rows_for

        self.device = torch.device(device)
        self.temperature = temperature if temperature > 0 else 1.0
        self.entropy_grad = entropy_grad
        self.logprob_chunk_rows = chunk_rows_for(logprob_chunk_rows)
        self.optim_settings = optim
        # bf16: the base in bf16 and the adapter in float32 (PEFT's master copy, which Adam
        # updates), computed under autocast in bf16 as the rollout engine computes it; without
        # autocast every LoRA layer would upcast its input and keep a float32 copy for backward
        self.compute_dtype = torch_dtype(dtype)
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.compute_dtype)
        torch.manual_seed(seed)
        self.model = get_peft_model(base, peft_lora_config(lora)).to(self.device)
        _sort_sets(self.model.peft_config["default"])
        self.merged = MergedPolicy(self.model, self.compute_dtype) if merged else None
        self.keep_merged_weights = keep_merged_weights
        if gradient_checkpointing and checkpointed_layers != 0:
            _enable_activation_checkpointing(base, checkpointed_layers)
        if compile_layers:
            _compile_decoder_layers(base)
        self.compile_layers = compile_layers
        self.plain_head = _plain_head(base)
        self.causal_masks = _causal_masks(base.config)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = _adamw(self.params, optim, total_steps)
        self.steps = 0
        self.frozen = FrozenWeights(
            self.model.parameters(), self.device, cpu_backup=base_cpu_backup
        )
        self.optimizer_state = (
            OptimizerState(self.optimizer, self.device) if base_cpu_backup else None
        )

    def forward(
        self, batch: TrainBatch, *, with_adapter: bool, with_entropy: bool = False
    ) -> ForwardOutput:
        import torch

        self.model.eval()
        layout = self._layout(batch)
        with torch.no_grad():
            if with_adapter:
                with self._merged_weights_kept():
                    out = self._forward(batch, with_entropy, layout)
            else:
                without = self.merged.base_only() if self.merged else self.model.disable_adapter()
                with without:
                    out = self._forward(batch, with_entropy, layout)
        entropy = None if out.entropy is None else out.entropy.cpu()
        return ForwardOutput(logprobs=out.logprobs.cpu(), entropy=entropy)

    def _layout(self, batch: TrainBatch) -> Layout:
        """`batch`'s `Layout`, read from its masks on the host, where the loop builds them."""
        import torch

        rows, columns = (batch.loss_mask > 0).nonzero(as_tuple=True)
        mask = batch.attention_mask.cpu()
        return Layout(
            where=(rows.to(self.device), columns.to(self.device)),
            causal_only=torch.equal(mask, mask.cumprod(dim=1)),
        )

    def _forward(self, batch: TrainBatch, with_entropy: bool, layout: Layout) -> ForwardOutput:
        """Log-probabilities (and entropy) of the tokens at ``layout.where``, 0 elsewhere."""
        import torch

        from trainer.grpo.logprobs import token_logprobs

        where = layout.where
        input_ids = batch.input_ids.to(self.device)
        attention_mask = (
            self.causal_masks if layout.causal_only else batch.attention_mask.to(self.device)
        )
        targets = input_ids[:, 1:][where]
        base = self.model.get_base_model()
        mixed_precision = self.compute_dtype != torch.float32
        with torch.autocast(self.device.type, self.compute_dtype, enabled=mixed_precision):
            if self.plain_head:
                hidden = base.get_decoder()(
                    input_ids=input_ids, attention_mask=attention_mask, use_cache=False
                ).last_hidden_state
                inputs, weight = hidden[:, :-1][where], base.get_output_embeddings().weight
            else:
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
                inputs, weight = logits[:, :-1][where], None
        logprobs, entropy = token_logprobs(
            inputs,
            targets,
            weight=weight,
            temperature=self.temperature,
            with_entropy=with_entropy,
            chunk_rows=self.logprob_chunk_rows,
            entropy_grad=self.entropy_grad and torch.is_grad_enabled(),
            compiled=self.compile_layers,
        )
        shape = batch.loss_mask.shape
        return ForwardOutput(
            logprobs=_scatter(shape, where, logprobs),
            entropy=None if entropy is None else _scatter(shape, where, entropy),
        )

    def train_step(self, micro_batches: Sequence[TrainBatch], loss_fn: LossFn) -> StepResult:
        import torch

        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}  # on the device: read once, after the last
        with self._merged_weights_kept():
            for micro_batch in micro_batches:
                on_device = self._to_device(micro_batch)
                layout = self._layout(micro_batch)
                out = self._forward(on_device, with_entropy=True, layout=layout)
                loss, metrics = loss_fn(out, on_device)
                loss.backward()
                for key, value in metrics.items():
                    totals[key] = totals[key] + value if key in totals else value
        self._average_gradients()
        clip = self.optim_settings.clip_grad if self.optim_settings.clip_grad > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        lr = self.scheduler.get_last_lr()[0]
        skipped = not math.isfinite(grad_norm)
        if skipped:  # as Megatron: a NaN/inf gradient would corrupt the adapter and Adam state
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.optimizer.step()
            self.scheduler.step()
        self.steps += 1
        metrics = {
            **{key: float(value) for key, value in totals.items()},
            "lr": lr,
            "skipped_step": float(skipped),
        }
        return StepResult(grad_norm=grad_norm, metrics=metrics)

    def _merged_weights_kept(self) -> contextlib.AbstractContextManager[None]:
        """A block of passes under one A and B (an optimizer step's, or one log-probability
        pass), with the merged weights kept where asked: each layer merges once, before the
        block, not inside a compiled layer, whose graph a merge would break (its switch to
        full float32 products, `lora_merge.full_float32_matmuls`)."""
        if self.merged is not None and self.keep_merged_weights:
            return self.merged.weights_kept()
        return contextlib.nullcontext()

    def _to_device(self, batch: TrainBatch) -> TrainBatch:
        moved = {
            f.name: getattr(batch, f.name).to(self.device)
            for f in fields(batch)
            if hasattr(getattr(batch, f.name), "to")
        }
        extras = {key: value.to(self.device) for key, value in batch.extras.items()}
        return replace(batch, **moved, extras=extras)

    def _average_gradients(self) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([grad.reshape(-1) for grad in grads])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = flat[offset : offset + grad.numel()].view_as(grad)
            offset += grad.numel()

    def export_adapter(self) -> LoraAdapter:
        """The adapter in the rollout engines' dtype: they run the same resolved ``--dtype`` as
        this trainer's compute dtype (bf16 on GPUs: half the bytes of the float32 master copy
        to copy and send; the engines would round to it on loading anyway), cast and packed
        into one buffer on the device, which then reaches the host in one copy."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.model)
        tensors = FlatTensors.pack(
            {name: tensor.detach().to(self.compute_dtype) for name, tensor in state.items()},
            device="cpu",
        )
        config = _json_safe(self.model.peft_config["default"].to_dict())
        return LoraAdapter(tensors=tensors, config=config, version=self.steps)

    def save(self, path: Path) -> None:
        """PEFT adapter in ``path/adapter`` (loads with ``PeftModel.from_pretrained``); optimizer,
        LR schedule, step count and torch RNG states in ``path/trainer_state.{json,safetensors}``
        (data only: `trainer.run.tensor_state`)."""
        import torch
        import torch.distributed as dist

        from trainer.run import tensor_state

        if dist.is_initialized() and dist.get_rank() != 0:
            return  # every rank holds the same adapter and optimizer state
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(path / ADAPTER_DIR))
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "steps": self.steps,
            "torch_rng": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        tensor_state.save(state, path / STATE_STEM)

    def load(self, path: Path) -> None:
        import torch
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        from trainer.run import tensor_state

        try:
            state = tensor_state.load(path / STATE_STEM)
        except (OSError, tensor_state.StateFormatError) as err:
            raise CheckpointError(f"{path}: no trainer state to resume ({err})") from None
        weights = load_peft_weights(str(path / ADAPTER_DIR), device=str(self.device))
        set_peft_model_state_dict(self.model, weights)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and "cuda_rng" in state:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)

    def merged_base(self) -> dict[str, torch.Tensor]:
        """The frozen base weights the engines merge into (`MergedPolicy.base`), to lend them
        to an engine on this GPU (`trainer.backends.shared_base`); merged serving only."""
        if self.merged is None:
            raise ValueError("only the merged policy's trainer (--lora-serving merged) lends")
        return self.merged.base()

    def release_memory(self) -> None:
        """The last step's gradients freed, and with ``--lora-base-cpu-backup`` the base and
        the optimizer's state off the GPU (`trainer.backends.frozen_weights`)."""
        if self.device.type != "cpu":
            self.optimizer.zero_grad(set_to_none=True)
            if self.optimizer_state is not None:
                self.optimizer_state.release()
            self.frozen.release()

    def resume_memory(self) -> None:
        if self.device.type != "cpu":
            if self.optimizer_state is not None:
                self.optimizer_state.restore()
            self.frozen.restore()


def resume_problem(config: TrainConfig, path: Path) -> str | None:
    """Why this trainer cannot resume checkpoint `path` with `config`, or None: its trainer
    state unreadable, or its adapter's tensors not the ones this run's model and LoRA flags
    make (names and shapes; `targets.adapter_shapes`)."""
    from safetensors import safe_open

    from trainer.backends.torch.targets import adapter_shapes
    from trainer.run import tensor_state

    try:
        tensor_state.check(path / STATE_STEM)
    except (OSError, tensor_state.StateFormatError) as err:
        return f"{path}: no trainer state to resume ({first_line(err)})"
    adapter_file = path / ADAPTER_DIR / "adapter_model.safetensors"
    with safe_open(str(adapter_file), framework="pt") as saved:
        shapes = {name: tuple(saved.get_slice(name).get_shape()) for name in saved.keys()}  # noqa: SIM118
    expected = adapter_shapes(config)
    model = config.checkpoint.hf_checkpoint
    for name, shape in expected.items():
        if name not in shapes:
            return (
                f"{adapter_file}: no {name}, which this run's adapter of {model} has (trained "
                "with other --target-modules or another model?); start without --load"
            )
        if shapes[name] != shape:
            return (
                f"{adapter_file}: {name} is {list(shapes[name])}, this run's adapter of {model} "
                f"needs {list(shape)} (another model or --lora-rank); start without --load"
            )
    if extra := sorted(set(shapes) - set(expected)):
        return (
            f"{adapter_file}: {extra[0]} is no tensor of this run's adapter of {model} (trained "
            "with other --target-modules or another model?); start without --load"
        )
    return None


def create(config: TrainConfig, device: str, *, total_steps: int) -> PeftPolicyTrainer:
    """The ``--train-backend torch`` factory (see `trainer.backends.registry`)."""
    return PeftPolicyTrainer(
        config.checkpoint.hf_checkpoint,
        config.lora,
        config.optimizer,
        total_steps=total_steps,
        device=device,
        dtype=config.placement.resolve_dtype(device),
        temperature=config.rollout.rollout_temperature,
        entropy_grad=config.algorithm.entropy_coef != 0,
        gradient_checkpointing=config.torch.gradient_checkpointing,
        checkpointed_layers=config.torch.checkpointed_layers,
        logprob_chunk_rows=config.torch.log_probs_chunk_size,
        base_cpu_backup=config.lora.lora_base_cpu_backup,
        merged=config.lora.merged,
        keep_merged_weights=config.torch.keep_merged_weights,
        compile_layers=config.torch.torch_compile_layers,
        seed=config.misc.seed,
    )
