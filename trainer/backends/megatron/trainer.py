"""Production policy trainer: a Megatron-core GPT built by Megatron-Bridge, with Bridge LoRA.

APIs followed (read from the released wheels): Megatron-Bridge 0.3.1 --
``AutoBridge.from_hf_pretrained``, ``to_megatron_provider(load_weights=True)`` (HF weights are
loaded by a pre-wrap hook; our LoRA hook runs after it), ``provider.finalize()``,
``initialize_model_parallel(seed)``, ``provide_distributed_model(ddp_config=...)``,
``peft.lora.LoRA(target_modules, dim, alpha, dropout)`` with ``disable_adapter(model)``,
``export_adapter_weights(model, cpu=True)``; Megatron-core 0.16.1 -- ``OptimizerConfig``,
``get_megatron_optimizer``, ``OptimizerParamScheduler``, ``finalize_model_grads``,
``pipeline_parallel.get_forward_backward_func``, ``tensor_parallel.vocab_parallel_cross_entropy``
and ``reduce_from_tensor_model_parallel_region``.

Sequences are right-padded rows in Megatron's ``[batch, seq]`` layout with a causal mask (right
padding cannot leak into real tokens). Log-probabilities are ``log_softmax(logits / T)`` with
the rollout temperature, as the engines define them. The reference policy is this model with
its adapters disabled. Data parallelism: every rank of one data-parallel group (its TP x PP x CP
ranks) must get the same batches; `data_parallel_rank` says which shard a rank takes.

Colocated memory (`release_memory`): see `trainer.backends.frozen_weights`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.backends.base import ForwardOutput, LoraAdapter, LossFn, StepResult, TrainBatch
from trainer.backends.devices import gpu_index
from trainer.backends.frozen_weights import FrozenWeights
from trainer.backends.megatron import config as mc
from trainer.backends.megatron import lora_names as names
from trainer.backends.megatron.batching import (
    context_parallel_order,
    context_parallel_positions,
    pack_by_token_budget,
    pad_batch,
    regroup,
    row_lengths,
)
from trainer.run.checkpoint import ADAPTER_DIR, CheckpointError

if TYPE_CHECKING:
    import torch

    from trainer.config import LoraConfig, MegatronConfig, TrainConfig

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER_DIR = "megatron_optimizer"
LAYOUT_FILE = "layout.json"  # in OPTIMIZER_DIR: the world size and parallel sizes that saved it


@dataclass
class _MicroBatch:
    """One micro-batch ready for the model: this CP rank's slice of tokens, labels, positions."""

    batch: TrainBatch  # the caller's rows on the GPU, unpadded (what the loss function sees)
    tokens: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    restore: torch.Tensor | None  # CP: gathered positions -> sequence order


@dataclass
class MegatronParts:
    """What the trainer drives: built from Megatron-Bridge by `build_parts`, or by hand from
    Megatron-core (the GPU test of the trainer's mechanics does that)."""

    model: list[Any]  # DDP-wrapped model chunks
    optimizer: Any  # MegatronOptimizer
    scheduler: Any  # OptimizerParamScheduler
    adapters: Any  # has ``disable_adapter(model)`` (Bridge's LoRA)
    attention: names.AttentionShape
    targets: names.LoraTargets  # the modules the adapters cover
    bridge: Any = None  # AutoBridge, for ``--megatron-to-hf-mode bridge``


def build_parts(config: TrainConfig, total_steps: int) -> MegatronParts:
    """Megatron-Bridge: HF checkpoint -> provider (parallel sizes, recompute) -> GPT with LoRA
    -> DDP; Megatron's distributed optimizer and LR schedule."""
    import torch
    from megatron.bridge import AutoBridge
    from megatron.bridge.peft.lora import LoRA
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    megatron = config.megatron
    dtype = torch.bfloat16 if mc.train_dtype(config.placement.dtype) == "bf16" else torch.float32
    bridge = AutoBridge.from_hf_pretrained(config.checkpoint.hf_checkpoint)
    provider = bridge.to_megatron_provider(load_weights=True)
    for key, value in mc.provider_settings(megatron).items():
        setattr(provider, key, value)
    provider.bf16 = dtype == torch.bfloat16
    provider.fp16 = False  # an fp16 checkpoint's config would otherwise claim both
    provider.params_dtype = dtype
    provider.pipeline_dtype = dtype
    provider.finalize()
    provider.initialize_model_parallel(seed=config.misc.seed)
    targets = names.resolve_targets(config.lora.target_modules, config.lora.exclude_modules)
    lora = LoRA(**mc.lora_settings(config.lora, targets))
    # Runs after the weight-loading hook that to_megatron_provider registered.
    provider.register_pre_wrap_hook(functools.partial(lora, training=True))
    model = provider.provide_distributed_model(
        ddp_config=DistributedDataParallelConfig(**mc.ddp_settings(megatron)),
        wrap_with_ddp=True,
        bf16=provider.bf16,
    )
    optimizer = get_megatron_optimizer(
        OptimizerConfig(
            **mc.optimizer_settings(config.optimizer, config.placement.dtype), params_dtype=dtype
        ),
        model,
    )
    scheduler = OptimizerParamScheduler(
        optimizer, **mc.scheduler_settings(config.optimizer, total_steps)
    )
    attention = names.AttentionShape(
        provider.num_attention_heads,
        provider.num_query_groups or provider.num_attention_heads,
        provider.kv_channels or provider.hidden_size // provider.num_attention_heads,
    )
    return MegatronParts(model, optimizer, scheduler, lora, attention, targets, bridge)


class MegatronPolicyTrainer:
    def __init__(
        self,
        parts: MegatronParts,
        *,
        device: str,
        lora: LoraConfig,
        megatron: MegatronConfig,
        base_model: str,
        micro_batch_size: int = 1,
        temperature: float = 1.0,
        entropy_grad: bool = False,
        logprob_chunk_rows: int = -1,
    ) -> None:
        """`base_model`: the HF checkpoint (the exported adapter's base). `temperature`: the
        rollout's, which the log-probabilities divide by; `entropy_grad`: the loss has an entropy
        term; `logprob_chunk_rows`: ``--log-probs-chunk-size``."""
        import torch
        from megatron.core import parallel_state
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.utils import get_model_config

        from trainer.grpo.logprob_chunks import chunk_rows_for

        self.lora_config = lora
        self.megatron = megatron
        self.base_model = base_model
        self.micro_batch_size = micro_batch_size
        self.entropy_grad = entropy_grad
        self.device = torch.device("cuda", gpu_index(device))
        self.temperature = temperature if temperature > 0 else 1.0
        self.logprob_chunk_rows = chunk_rows_for(logprob_chunk_rows)
        self.targets = parts.targets
        self.model = parts.model
        self.optimizer = parts.optimizer
        self.scheduler = parts.scheduler
        self.adapters = parts.adapters
        self.attention = parts.attention
        self.bridge = parts.bridge
        config = get_model_config(self.model[0])
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss

        self.ps = parallel_state
        self.data_parallel_rank = parallel_state.get_data_parallel_rank()
        self.data_parallel_size = parallel_state.get_data_parallel_world_size()
        self.steps = 0
        self.frozen = FrozenWeights(
            (p for chunk in self.model for p in chunk.parameters()),
            self.device,
            cpu_backup=lora.lora_base_cpu_backup,
        )

    # ----------------------------------------------------------------------------- forward

    def forward(
        self, batch: TrainBatch, *, with_adapter: bool, with_entropy: bool = False
    ) -> ForwardOutput:
        import torch

        groups = self._groups(row_lengths(batch), batch.input_ids.shape[0])
        pieces = regroup([batch], groups)
        adapter = nullcontext() if with_adapter else self.adapters.disable_adapter(self.model)
        for chunk in self.model:
            chunk.eval()
        with torch.no_grad(), adapter:
            outputs = self._run(pieces, loss_fn=None, with_entropy=with_entropy, forward_only=True)
        rows, seq = batch.input_ids.shape
        logprobs = torch.zeros(rows, seq - 1)
        entropy = torch.zeros(rows, seq - 1) if with_entropy else None
        for group, out in zip(groups, outputs, strict=True):
            index = torch.tensor(group)
            width = out["logprobs"].shape[1]
            logprobs[index, :width] = out["logprobs"]
            if entropy is not None:
                entropy[index, :width] = out["entropy"]
        return ForwardOutput(logprobs=logprobs, entropy=entropy)

    def _groups(self, lengths: list[int], rows: int) -> list[list[int]]:
        if self.megatron.use_dynamic_batch_size:
            return pack_by_token_budget(lengths, self.megatron.max_tokens_per_gpu)
        size = self.micro_batch_size
        return [list(range(start, min(start + size, rows))) for start in range(0, rows, size)]

    # -------------------------------------------------------------------------- training

    def train_step(self, micro_batches: Sequence[TrainBatch], loss_fn: LossFn) -> StepResult:
        """One optimizer step over the caller's micro-batches. With ``--use-dynamic-batch-size``
        their rows are regrouped under ``--max-tokens-per-gpu``: exact for losses normalised
        step-wide (`trainer.grpo.loss.Normalizer`), which the loop's pre-scaled losses are."""
        pieces = list(micro_batches)
        if self.megatron.use_dynamic_batch_size:
            lengths = [n for mb in micro_batches for n in row_lengths(mb)]
            pieces = regroup(micro_batches, self._groups(lengths, len(lengths)))
        for chunk in self.model:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        outputs = self._run(pieces, loss_fn=loss_fn, with_entropy=True, forward_only=False)
        lr = self.optimizer.param_groups[0]["lr"]
        updated, grad_norm, _ = self.optimizer.step()
        if updated:
            self.scheduler.step(increment=1)
        self.steps += 1
        # Each micro-batch's metrics are its share of the step's value (`trainer.grpo.loss`): sum.
        metrics: dict[str, float] = {}
        for out in outputs:
            for key, value in out["metrics"].items():
                metrics[key] = metrics.get(key, 0.0) + float(value)
        metrics["lr"] = lr
        # Megatron skips an update whose gradients are not finite (as the PEFT trainer does).
        metrics["skipped_step"] = float(not updated)
        # Megatron reports no norm for a skipped update (non-finite gradients).
        return StepResult(
            grad_norm=math.nan if grad_norm is None else float(grad_norm), metrics=metrics
        )

    # ------------------------------------------------------------------ the Megatron pass

    def _run(
        self,
        pieces: list[TrainBatch],
        *,
        loss_fn: LossFn | None,
        with_entropy: bool,
        forward_only: bool,
    ) -> list[dict[str, Any]]:
        """Forward (and backward) over `pieces` through Megatron's pipeline schedule; returns one
        dict per micro-batch on every rank (broadcast from the last pipeline stage)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        prepared = [self._prepare(piece) for piece in pieces]
        count = len(prepared)

        def forward_step(data_iterator: Any, model: Any) -> tuple[Any, Any]:
            item = next(data_iterator)
            output = model(input_ids=item.tokens, position_ids=item.positions, attention_mask=None)
            return output, functools.partial(self._loss, item, loss_fn, with_entropy, count)

        store = get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(prepared),
            model=self.model,
            num_microbatches=count,
            seq_length=max(item.tokens.shape[1] for item in prepared),
            micro_batch_size=max(item.tokens.shape[0] for item in prepared),
            forward_only=forward_only,
        )
        return self._from_last_stage(store)

    def _prepare(self, piece: TrainBatch) -> _MicroBatch:
        import torch

        on_device = _to_device(piece, self.device)
        padded = pad_batch(on_device, mc.sequence_multiple(self.megatron))
        tokens = padded.input_ids
        rows, seq = tokens.shape
        labels = torch.zeros_like(tokens)
        labels[:, :-1] = tokens[:, 1:]
        positions = torch.arange(seq, device=self.device).unsqueeze(0).expand(rows, seq)
        restore = None
        cp = self.ps.get_context_parallel_world_size()
        if cp > 1:
            local = torch.tensor(
                context_parallel_positions(seq, cp, self.ps.get_context_parallel_rank()),
                device=self.device,
            )
            tokens, labels, positions = (
                t.index_select(1, local) for t in (tokens, labels, positions)
            )
            order = torch.tensor(context_parallel_order(seq, cp), device=self.device)
            restore = order.argsort()
        return _MicroBatch(on_device, tokens.contiguous(), labels.contiguous(), positions, restore)

    def _loss(
        self,
        item: _MicroBatch,
        loss_fn: LossFn | None,
        with_entropy: bool,
        count: int,
        output: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        import torch

        entropy_grad = loss_fn is not None and self.entropy_grad
        if self.ps.get_tensor_model_parallel_world_size() == 1:
            logprobs, entropy = self._chunked_logprobs(
                output, item.labels, with_entropy, entropy_grad
            )
        else:
            logprobs, entropy = self._vocab_parallel_logprobs(
                output, item.labels, with_entropy, entropy_grad
            )
        width = item.batch.input_ids.shape[1] - 1
        logprobs = self._gather_sequence(logprobs, item)[:, :width]
        if entropy is not None:
            entropy = self._gather_sequence(entropy, item)[:, :width]
        if loss_fn is None:
            out = {"logprobs": logprobs.detach().cpu()}
            if entropy is not None:
                out["entropy"] = entropy.detach().cpu()
            return torch.zeros((), device=self.device), out
        loss, metrics = loss_fn(ForwardOutput(logprobs=logprobs, entropy=entropy), item.batch)
        # Megatron multiplies by CP size and divides by the micro-batch count; the loop's loss
        # is already scaled for accumulation, and CP ranks each hold the full (gathered) loss.
        cp = self.ps.get_context_parallel_world_size()
        return loss * count / cp, {"metrics": metrics}

    def _chunked_logprobs(
        self, output: torch.Tensor, labels: torch.Tensor, with_entropy: bool, entropy_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One rank holds the whole vocabulary: `trainer.grpo.logprobs` upcasts and reduces
        ``--log-probs-chunk-size`` rows of the ``[batch, seq, vocab]`` logits at a time, so no
        float32 copy of them exists (5 GB per 8,192-token row with Qwen's vocabulary)."""
        import torch

        from trainer.grpo.logprobs import token_logprobs

        rows, seq, vocab = output.shape
        logprobs, entropy = token_logprobs(
            output.reshape(rows * seq, vocab),
            labels.reshape(rows * seq),
            temperature=self.temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad and torch.is_grad_enabled(),
            chunk_rows=self.logprob_chunk_rows,
        )
        return (
            logprobs.view(rows, seq),
            None if entropy is None else entropy.view(rows, seq),
        )

    def _vocab_parallel_logprobs(
        self, output: torch.Tensor, labels: torch.Tensor, with_entropy: bool, entropy_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tensor parallelism splits the vocabulary over ranks: Megatron's vocab-parallel
        cross entropy, and the entropy reduced over the tensor-parallel group."""
        import torch
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits = output.float() / self.temperature
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = self._entropy(logits)
        # vocab_parallel_cross_entropy shifts its input in place: give it a copy when the
        # entropy's graph still needs the logits.
        ce_input = logits.clone() if entropy is not None and entropy.requires_grad else logits
        return -vocab_parallel_cross_entropy(ce_input, labels), entropy

    def _entropy(self, logits: torch.Tensor) -> torch.Tensor:
        """Entropy of softmax(logits) when the vocabulary is split over tensor-parallel ranks."""
        import torch.distributed as dist
        from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

        top = logits.detach().max(dim=-1, keepdim=True).values
        if self.ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(
                top, op=dist.ReduceOp.MAX, group=self.ps.get_tensor_model_parallel_group()
            )
        shifted = logits - top
        exp = shifted.exp()
        total = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
        weighted = reduce_from_tensor_model_parallel_region((exp * shifted).sum(dim=-1))
        return total.log() - weighted / total

    def _gather_sequence(self, local: torch.Tensor, item: _MicroBatch) -> torch.Tensor:
        """CP: every rank's ``[B, S/CP]`` slice -> ``[B, S]`` in sequence order (with grads)."""
        import torch
        from torch.distributed.nn.functional import all_gather

        if item.restore is None:
            return local
        parts = all_gather(local.contiguous(), group=self.ps.get_context_parallel_group())
        return torch.cat(parts, dim=1).index_select(1, item.restore)

    def _from_last_stage(self, store: list[Any]) -> list[Any]:
        import torch.distributed as dist

        if self.ps.get_pipeline_model_parallel_world_size() == 1:
            return store
        payload = [store if self.ps.is_pipeline_last_stage() else None]
        dist.broadcast_object_list(
            payload,
            src=self.ps.get_pipeline_model_parallel_last_rank(),
            group=self.ps.get_pipeline_model_parallel_group(),
        )
        return payload[0]

    # ------------------------------------------------------------------------- adapters

    def export_adapter(self) -> LoraAdapter:
        """The adapter under PEFT names, full (TP-gathered, all pipeline stages) on every rank."""
        if self.megatron.megatron_to_hf_mode == "bridge":
            if self.bridge is None:
                raise RuntimeError("--megatron-to-hf-mode bridge needs the model built by Bridge")
            import torch

            tensors = {}
            # Bridge yields q/k/v's (and gate/up's) shared lora_A as one tensor several times, and
            # with TP = 1 the live parameters: own copies, or safetensors refuses shared memory.
            with torch.no_grad():
                for name, tensor in self.bridge.export_adapter_weights(
                    self.model, cpu=True, show_progress=False
                ):
                    names.parse_peft_key(name)
                    key = names.PEFT_PREFIX + name.removeprefix(names.PEFT_PREFIX)
                    tensors[key] = tensor.detach().contiguous().clone()
        else:
            tensors = names.megatron_to_peft(self._gather_adapter(), self.attention)
        config = names.peft_config(
            self.targets,
            rank=self.lora_config.lora_rank,
            alpha=self.lora_config.lora_alpha,
            dropout=self.lora_config.lora_dropout,
            base_model=self.base_model,
        )
        return LoraAdapter(tensors=tensors, config=config, version=self.steps)

    def _adapter_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """``(Megatron name with global layer number, parameter)`` for this rank's adapters."""
        found = []
        for chunk in self.model:
            layers = _unwrap(chunk).decoder.layers
            for name, param in chunk.named_parameters():
                parsed = names.parse_megatron_key(name)
                if parsed is None:
                    continue
                local, module, which = parsed
                found.append(
                    (names.megatron_key(layers[local].layer_number - 1, module, which), param)
                )
        return found

    def _gather_adapter(self) -> dict[str, torch.Tensor]:
        import torch
        import torch.distributed as dist

        tp = self.ps.get_tensor_model_parallel_world_size()
        group = self.ps.get_tensor_model_parallel_group()
        state = {}
        for key, param in self._adapter_params():
            _, module, which = names.parse_megatron_key(key)
            shards = [torch.empty_like(param.data) for _ in range(tp)]
            dist.all_gather(shards, param.data.contiguous(), group=group)
            state[key] = names.gather_tp_shards(module, which, [s.cpu() for s in shards])
        if self.ps.get_pipeline_model_parallel_world_size() > 1:
            stages: list[Any] = [None] * self.ps.get_pipeline_model_parallel_world_size()
            dist.all_gather_object(stages, state, group=self.ps.get_pipeline_model_parallel_group())
            state = {k: v for stage in stages for k, v in stage.items()}
        return state

    def _load_adapter_tensors(self, peft_tensors: dict[str, torch.Tensor]) -> None:
        import torch

        full = names.peft_to_megatron(peft_tensors, self.attention)
        tp = self.ps.get_tensor_model_parallel_world_size()
        rank = self.ps.get_tensor_model_parallel_rank()
        with torch.no_grad():
            for key, param in self._adapter_params():
                if key not in full:
                    raise names.LoraNameError(f"the saved adapter has no {key}")
                _, module, which = names.parse_megatron_key(key)
                param.data.copy_(names.shard_for_tp(module, which, full[key], tp, rank))

    # ----------------------------------------------------------------------- checkpoints

    def save(self, path: Path) -> None:
        """PEFT adapter in ``path/adapter`` (loads with ``PeftModel.from_pretrained``); each rank's
        optimizer shard (main params and moments), the LR schedule and the step count in
        ``megatron_optimizer/rank<N>.{json,safetensors}`` (data only: `trainer.run.tensor_state`),
        and the parallel layout that wrote them in ``megatron_optimizer/layout.json``.

        One state per rank, so a resume needs the same world size and parallel layout. (Megatron's
        ``save_parameter_state`` was not used: with PyTorch's Adam, its fallback without Apex or
        TE, megatron-core 0.16.1 cannot load what it saved.)
        """
        import torch.distributed as dist
        from safetensors.torch import save_file

        from trainer.run import tensor_state

        adapter = self.export_adapter()
        if dist.get_rank() == 0:
            (path / OPTIMIZER_DIR).mkdir(parents=True, exist_ok=True)
            (path / ADAPTER_DIR).mkdir(parents=True, exist_ok=True)
            tensors = {k: v.contiguous() for k, v in adapter.tensors.items()}
            save_file(tensors, str(path / ADAPTER_DIR / ADAPTER_FILE))
            config = json.dumps(dict(adapter.config), indent=2)
            (path / ADAPTER_DIR / ADAPTER_CONFIG).write_text(config)
            layout = json.dumps(self._layout(), indent=2)
            (path / OPTIMIZER_DIR / LAYOUT_FILE).write_text(layout + "\n")
        dist.barrier()
        state = optimizer_state(self._optimizers(), self.scheduler, self.steps)
        tensor_state.save(state, self._state_stem(path))
        dist.barrier()

    def load(self, path: Path) -> None:
        import torch
        from safetensors.torch import load_file

        from trainer.run import tensor_state

        saved = json.loads((path / OPTIMIZER_DIR / LAYOUT_FILE).read_text(encoding="utf-8"))
        if (problem := layout_problem(saved, self._layout())) is not None:
            raise CheckpointError(f"{path}: {problem}")
        self._load_adapter_tensors(load_file(str(path / ADAPTER_DIR / ADAPTER_FILE)))
        state = tensor_state.load(self._state_stem(path))
        # With fp32 weights the main params are views of the trainable parameters.
        with torch.no_grad():
            for opt, inner_state, mains in zip(
                self._optimizers(), state["optimizers"], state["main_params"], strict=True
            ):
                opt.optimizer.load_state_dict(inner_state)
                params = [p for group in opt.optimizer.param_groups for p in group["params"]]
                for param, saved_param in zip(params, mains, strict=True):
                    param.copy_(saved_param)
        self.scheduler.load_state_dict(state["scheduler"])
        self.steps = state["steps"]

    def _optimizers(self) -> list[Any]:
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def _layout(self) -> dict[str, int]:
        import torch.distributed as dist

        return {
            "world_size": dist.get_world_size(),
            "tensor_model_parallel_size": self.ps.get_tensor_model_parallel_world_size(),
            "pipeline_model_parallel_size": self.ps.get_pipeline_model_parallel_world_size(),
            "context_parallel_size": self.ps.get_context_parallel_world_size(),
            "expert_model_parallel_size": self.ps.get_expert_model_parallel_world_size(),
        }

    def _state_stem(self, path: Path) -> Path:
        import torch.distributed as dist

        return state_stem(path, dist.get_rank())

    # ------------------------------------------------------------------ colocated memory

    def release_memory(self) -> None:
        self.frozen.release()

    def resume_memory(self) -> None:
        self.frozen.restore()


def state_stem(path: Path, rank: int) -> Path:
    """Where rank `rank` saves its optimizer state in checkpoint `path` (`tensor_state`)."""
    return path / OPTIMIZER_DIR / f"rank{rank:05d}"


def optimizer_state(optimizers: Sequence[Any], scheduler: Any, steps: int) -> dict[str, Any]:
    """What one rank saves: the state dict of each of its (chained) optimizers' inner torch
    optimizer, their main params in optimizer order, the LR schedule and the step count."""
    inner = [opt.optimizer for opt in optimizers]
    return {
        "optimizers": [opt.state_dict() for opt in inner],
        "main_params": [
            [p.detach() for group in opt.param_groups for p in group["params"]] for opt in inner
        ],
        "scheduler": scheduler.state_dict(),
        "steps": steps,
    }


def run_layout(config: TrainConfig) -> dict[str, int]:
    """The world size and parallel sizes a run of `config` trains with (`MegatronPolicyTrainer`
    records its own in ``layout.json``)."""
    from trainer.config.megatron import PARALLEL_SIZES

    sizes = {name: getattr(config.megatron, name) for name in PARALLEL_SIZES}
    return {"world_size": config.placement.actor_num_gpus, **sizes}


def layout_problem(saved: Any, current: dict[str, int]) -> str | None:
    """How a checkpoint's layout differs from this run's, or None: each rank resumes its own
    optimizer shard, so the world size and every parallel size must be the same."""

    def shown(layout: dict[str, Any]) -> str:
        sizes = ", ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in layout.items() if k != "world_size"
        )
        return f"{layout.get('world_size')} training ranks ({sizes})"

    if not isinstance(saved, dict) or set(saved) != set(current):
        return f"its {LAYOUT_FILE} is not a layout of {', '.join(current)}"
    if saved != current:
        return (
            f"saved by {shown(saved)}; this run has {shown(current)}: resume with the same "
            "training GPUs and parallel sizes, or start without --load"
        )
    return None


def resume_problem(config: TrainConfig, path: Path) -> str | None:
    """The first reason checkpoint `path` cannot resume with `config`, from its JSON alone:
    another layout, or a rank's optimizer state missing."""
    from trainer.run import tensor_state

    layout_file = path / OPTIMIZER_DIR / LAYOUT_FILE
    try:
        saved = json.loads(layout_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return f"{layout_file}: cannot be read ({err})"
    if (problem := layout_problem(saved, run_layout(config))) is not None:
        return f"{path}: {problem}"
    for rank in range(saved["world_size"]):
        for file in tensor_state.paths(state_stem(path, rank)):
            if not file.is_file():
                return f"{file}: missing (each training rank resumes its own optimizer state)"
    return None


def _to_device(batch: TrainBatch, device: Any) -> TrainBatch:
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in fields(batch)
        if f.name != "extras" and getattr(batch, f.name) is not None
    }
    return replace(batch, **moved, extras={k: v.to(device) for k, v in batch.extras.items()})


def _unwrap(chunk: Any) -> Any:
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def create(config: TrainConfig, device: str, *, total_steps: int) -> MegatronPolicyTrainer:
    """The ``--train-backend megatron`` factory (see `trainer.backends.registry`)."""
    import torch

    torch.cuda.set_device(gpu_index(device))
    return policy_trainer(config, device, build_parts(config, total_steps))


def policy_trainer(config: TrainConfig, device: str, parts: MegatronParts) -> MegatronPolicyTrainer:
    """The trainer of `parts` (built by `build_parts`, or by hand) with the config's settings."""
    return MegatronPolicyTrainer(
        parts,
        device=device,
        lora=config.lora,
        megatron=config.megatron,
        base_model=config.checkpoint.hf_checkpoint,
        micro_batch_size=config.batch.micro_batch_size,
        temperature=config.rollout.rollout_temperature,
        entropy_grad=config.algorithm.entropy_coef != 0,
        logprob_chunk_rows=config.torch.log_probs_chunk_size,
    )
