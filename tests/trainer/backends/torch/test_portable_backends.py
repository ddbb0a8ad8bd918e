"""Portable backends on the tiny model: PEFT LoRA trainer and transformers rollout engine."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from peft import get_peft_model_state_dict

from tests.support.tiny_training import CountedOps, mean_logprob_loss, micro_batches
from trainer import tiny
from trainer.backends.base import (
    ForwardOutput,
    PolicyTrainer,
    RolloutEngine,
    SamplingParams,
    TrainBatch,
)
from trainer.backends.flat_tensors import FlatTensors
from trainer.backends.torch.rollout import HFRolloutEngine
from trainer.backends.torch.trainer import (
    PeftPolicyTrainer,
    _causal_masks,
    _enable_activation_checkpointing,
    lr_factor,
)
from trainer.batching import pack
from trainer.config import LoraConfig, OptimizerConfig
from trainer.grpo.loss import GRPOConfig, Normalizer, entropy_from_logits
from trainer.loop import GRPOLoss

PROMPTS = [[1, 4, 7, 8, 2, 1, 6], [1, 4, 7, 12, 2, 1, 6], [1, 4, 7, 15, 2, 1, 6]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=3)
    return str(root / "model")


def make_trainer(model_dir: str, **lora: object) -> PeftPolicyTrainer:
    settings = LoraConfig(**{"lora_rank": 4, "lora_alpha": 8.0, **lora})
    return PeftPolicyTrainer(model_dir, settings, OptimizerConfig(lr=5e-2), total_steps=10)


def batch_of(engine: HFRolloutEngine, advantages: list[float], seed: int = 0):
    generations = engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, seed=seed))
    return generations, pack(generations, advantages, pad_id=0)


def loss_for(batch, trainer: PeftPolicyTrainer):
    batch.old_logprobs = trainer.forward(batch, with_adapter=True).logprobs
    batch.ref_logprobs = trainer.forward(batch, with_adapter=False).logprobs
    return GRPOLoss(GRPOConfig(), Normalizer.from_masks([batch.loss_mask]))


def test_backends_implement_the_interfaces(model_dir):
    assert isinstance(make_trainer(model_dir), PolicyTrainer)
    assert isinstance(HFRolloutEngine(model_dir), RolloutEngine)


def test_generation_logprobs_truncation_and_eos(model_dir):
    engine = HFRolloutEngine(model_dir)
    generations = engine.generate(PROMPTS * 8, SamplingParams(max_new_tokens=3, seed=1))
    assert len(generations) == 24
    eos = engine.eos_ids
    for g in generations:
        assert 1 <= len(g.response_ids) <= 3
        assert len(g.response_logprobs) == len(g.response_ids)
        assert all(lp <= 0 and math.isfinite(lp) for lp in g.response_logprobs)
        ended = g.response_ids[-1] in eos
        assert g.truncated == (not ended)
        assert not any(t in eos for t in g.response_ids[:-1])
    assert any(g.truncated for g in generations)


def test_sampling_is_seeded_and_top_k_1_is_greedy(model_dir):
    engine = HFRolloutEngine(model_dir)
    params = SamplingParams(max_new_tokens=4, seed=5)
    assert engine.generate(PROMPTS, params) == engine.generate(PROMPTS, params)
    greedy = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, temperature=0.0))
    top1 = engine.generate(PROMPTS, SamplingParams(max_new_tokens=4, top_k=1, seed=9))
    assert [g.response_ids for g in greedy] == [g.response_ids for g in top1]


@pytest.mark.parametrize("seed", [None, 0, 1234, 2**40])
def test_the_samples_of_one_prompt_differ_under_any_seed(model_dir, seed):
    engine = HFRolloutEngine(model_dir)
    generations = engine.generate([PROMPTS[0]] * 8, SamplingParams(max_new_tokens=6, seed=seed))
    assert len({g.response_ids for g in generations}) > 1


def test_each_sample_has_its_own_seed_whatever_shares_its_batch(model_dir):
    engine = HFRolloutEngine(model_dir)
    params = SamplingParams(max_new_tokens=6, seed=7)
    alone = engine.generate(PROMPTS[:2], params)
    shared = engine.generate(PROMPTS, params)[:2]  # log-probs may differ in the last bits
    assert [g.response_ids for g in shared] == [g.response_ids for g in alone]


def test_stop_token_ids_end_a_response(model_dir):
    engine = HFRolloutEngine(model_dir)
    free = engine.generate(PROMPTS * 4, SamplingParams(max_new_tokens=6, seed=3))
    stop = next(t for g in free for t in g.response_ids[:-1] if t not in engine.eos_ids)
    params = SamplingParams(max_new_tokens=6, seed=3, stop_token_ids=(stop,))
    stopped = engine.generate(PROMPTS * 4, params)
    assert any(g.response_ids[-1] == stop and not g.truncated for g in stopped)
    assert all(stop not in g.response_ids[:-1] for g in stopped)


def test_stop_strings_end_a_response_after_the_first_one(model_dir):
    engine = HFRolloutEngine(model_dir)
    tokenizer = engine.tokenizer()
    params = SamplingParams(max_new_tokens=6, seed=3, stop=("red",))
    generations = engine.generate(PROMPTS * 8, params)
    texts = [tokenizer.decode(g.response_ids) for g in generations]
    stopped = [t for t in texts if "red" in t]
    assert stopped and all(t.endswith("red") and t.count("red") == 1 for t in stopped)
    assert not any(g.truncated for g, t in zip(generations, texts, strict=True) if "red" in t)
    assert all(len(g.response_logprobs) == len(g.response_ids) for g in generations)


def test_an_adapter_with_missing_tensors_is_refused(model_dir):
    from dataclasses import replace

    engine = HFRolloutEngine(model_dir)
    adapter = make_trainer(model_dir).export_adapter()
    dropped = sorted(adapter.tensors)[0]
    partial = replace(adapter, tensors={k: v for k, v in adapter.tensors.items() if k != dropped})
    with pytest.raises(ValueError, match=r"adapter lacks 1 LoRA tensor\(s\)"):
        engine.load_adapter(partial)
    engine.load_adapter(adapter)  # the complete adapter loads


def test_sampling_ignores_the_checkpoints_generation_defaults(model_dir, tmp_path):
    """A checkpoint's generation_config.json (top_k, repetition penalty, ...) must not change
    what the engine samples: only `SamplingParams` does (unset top_k would mean 50)."""
    import shutil

    shutil.copytree(model_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    config.update(top_k=1, temperature=0.1, repetition_penalty=5.0, do_sample=False)
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(config))
    params = SamplingParams(max_new_tokens=4, seed=3)
    plain = HFRolloutEngine(model_dir).generate(PROMPTS * 4, params)
    assert HFRolloutEngine(str(tmp_path / "m")).generate(PROMPTS * 4, params) == plain
    assert len({g.response_ids for g in plain}) > 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_match_the_trainers(model_dir, temperature):
    """The engine's log-probabilities (left-padded, KV cache) equal the trainer's (right-padded),
    both as log_softmax(logits / temperature) of the sampled token."""
    engine = HFRolloutEngine(model_dir)
    trainer = make_trainer(model_dir)
    trainer.temperature = temperature
    generations = engine.generate(
        PROMPTS, SamplingParams(max_new_tokens=5, temperature=temperature, top_p=0.9, seed=2)
    )
    batch = pack(generations, [0.0] * 3, pad_id=0)
    logprobs = trainer.forward(batch, with_adapter=True).logprobs
    diff = ((logprobs - batch.rollout_logprobs).abs() * batch.loss_mask).max()
    assert float(diff) < 1e-4


def test_reference_is_the_base_model_and_training_moves_only_the_policy(model_dir):
    from transformers import AutoModelForCausalLM

    engine = HFRolloutEngine(model_dir)
    trainer = make_trainer(model_dir)
    _, batch = batch_of(engine, [1.0, -1.0, 0.5])
    before = trainer.forward(batch, with_adapter=True).logprobs
    assert torch.equal(before, trainer.forward(batch, with_adapter=False).logprobs)

    result = trainer.train_step([batch], loss_for(batch, trainer))
    assert result.grad_norm > 0 and result.metrics["lr"] == pytest.approx(5e-2)
    assert {"pg_loss", "pg_clipfrac", "kl", "entropy"} <= result.metrics.keys()
    after = trainer.forward(batch, with_adapter=True).logprobs
    reference = trainer.forward(batch, with_adapter=False).logprobs
    assert not torch.allclose(after, before)

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        logits = base(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    mask = batch.loss_mask.bool()
    assert torch.allclose(reference[mask], expected[mask], atol=1e-5)
    assert not reference[~mask].any()  # only the response tokens are scored


def test_a_non_finite_gradient_skips_and_counts_the_step(model_dir):
    engine = HFRolloutEngine(model_dir)
    trainer = make_trainer(model_dir)
    _, batch = batch_of(engine, [1.0, -1.0, 0.5])
    loss_fn = loss_for(batch, trainer)
    before = [p.detach().clone() for p in trainer.params]

    def nan_loss(out, mb):
        loss, metrics = loss_fn(out, mb)
        return loss * float("nan"), metrics

    result = trainer.train_step([batch], nan_loss)
    assert math.isnan(result.grad_norm) and result.metrics["skipped_step"] == 1.0
    assert not trainer.optimizer.state  # Adam state untouched
    assert all(torch.equal(p, q) for p, q in zip(trainer.params, before, strict=True))
    assert trainer.scheduler.last_epoch == 0  # the LR schedule does not advance either
    result = trainer.train_step([batch], loss_fn)
    assert math.isfinite(result.grad_norm) and result.metrics["skipped_step"] == 0.0
    assert all(torch.isfinite(p).all() for p in trainer.params)
    assert not all(torch.equal(p, q) for p, q in zip(trainer.params, before, strict=True))


def test_micro_batches_accumulate_to_the_full_batch_gradient(model_dir):
    engine = HFRolloutEngine(model_dir)
    generations = engine.generate(PROMPTS * 2, SamplingParams(max_new_tokens=5, seed=4))
    advantages = [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]
    whole = pack(generations, advantages, pad_id=0)
    halves = [pack(generations[:3], advantages[:3], 0), pack(generations[3:], advantages[3:], 0)]
    one, two = make_trainer(model_dir), make_trainer(model_dir)
    loss = loss_for(whole, one)
    for half in halves:
        loss_for(half, two)
    split_loss = GRPOLoss(GRPOConfig(), Normalizer.from_masks(h.loss_mask for h in halves))
    a = one.train_step([whole], loss)
    b = two.train_step(halves, split_loss)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    for key in ("pg_loss", "kl", "entropy"):
        assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-4, abs=1e-7)
    for p, q in zip(one.params, two.params, strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def makes_the_host_wait(func, args) -> bool:
    """On a GPU, the host waits for the device: reading a value (``.item()``, ``float()``) and
    indexing with a boolean mask (its count is the device's). Counted on the CPU, where they
    cost nothing, to keep them out of the micro-batch loop."""
    masked = func is torch.ops.aten.index.Tensor and any(
        index is not None and index.dtype == torch.bool for index in args[1]
    )
    return masked or func is torch.ops.aten._local_scalar_dense.default


def test_the_host_reads_the_device_once_per_step_not_per_micro_batch(model_dir):
    """The micro-batches' metrics stay on the device until the step's end, and the loss tokens
    are found on the host's mask: a step of 4 micro-batches waits for the device as often as
    a step of 1 (the gradient norm, the metrics, the optimizer's own)."""
    engine = HFRolloutEngine(model_dir)
    generations = engine.generate(PROMPTS * 4, SamplingParams(max_new_tokens=5, seed=4))
    batches = [pack(generations[i : i + 3], [1.0, -1.0, 0.5], pad_id=0) for i in (0, 3, 6, 9)]
    waits = []
    for step in (batches[:1], batches):
        trainer = make_trainer(model_dir)
        for batch in step:
            batch.rollout_logprobs = trainer.forward(batch, with_adapter=True).logprobs
        loss_fn = GRPOLoss(GRPOConfig(), Normalizer.from_masks(b.loss_mask for b in step))
        with CountedOps(makes_the_host_wait) as counter:
            result = trainer.train_step(step, loss_fn)
        assert {"pg_loss", "entropy", "train_rollout_logprob_abs_diff"} <= result.metrics.keys()
        waits.append(counter.count)
    assert waits[0] == waits[1] > 0


def test_right_padded_rows_attend_causally_without_their_padding_mask(model_dir):
    """Every row of a packed batch is its tokens then padding: causal attention alone gives each
    loss token the log-probability the padding mask gives it; a row with a hole keeps the mask."""
    engine = HFRolloutEngine(model_dir)
    generations = engine.generate(PROMPTS * 2, SamplingParams(max_new_tokens=6, seed=2))
    cut = [  # responses of several lengths: padded rows
        replace(g, response_ids=g.response_ids[:n], response_logprobs=g.response_logprobs[:n])
        for g, n in zip(generations, (6, 2, 4, 1, 5, 3), strict=True)
    ]
    batch = pack(cut, [1.0] * 6, pad_id=0)
    assert not batch.attention_mask.all()
    trainer = make_trainer(model_dir)
    layout = trainer._layout(batch)
    assert layout.causal_only
    with torch.no_grad():
        causal = trainer._forward(batch, True, layout)
        masked = trainer._forward(batch, True, replace(layout, causal_only=False))
    torch.testing.assert_close(causal.logprobs, masked.logprobs, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(causal.entropy, masked.entropy, atol=1e-6, rtol=1e-6)
    holed = replace(batch, attention_mask=batch.attention_mask.clone())
    holed.attention_mask[0, 1] = 0
    assert not trainer._layout(holed).causal_only


def test_only_fully_attending_models_get_no_mask_at_all():
    """Sliding-window layers need their window's mask: transformers builds it from the
    positions; so does a model without layer types."""
    full = SimpleNamespace(layer_types=["full_attention", "full_attention"])
    sliding = SimpleNamespace(layer_types=["full_attention", "sliding_attention"])
    assert _causal_masks(full) == {"full_attention": None}
    assert _causal_masks(sliding) is None
    assert _causal_masks(SimpleNamespace()) is None


def test_adapter_reaches_the_engine_in_memory(model_dir):
    engine = HFRolloutEngine(model_dir)
    trainer = make_trainer(model_dir)
    _, batch = batch_of(engine, [1.0, -1.0, 0.5])
    for _ in range(2):
        trainer.train_step([batch], loss_for(batch, trainer))
    adapter = trainer.export_adapter()
    assert adapter.version == 2
    assert {t.dtype for t in adapter.tensors.values()} == {torch.float32}  # the fp32 engine's
    # One buffer, a copy: it travels (through Ray) as one tensor, and training goes on apart.
    assert isinstance(adapter.tensors, FlatTensors)
    state = get_peft_model_state_dict(trainer.model)
    assert all(torch.equal(adapter.tensors[k], t) for k, t in state.items())
    assert all(t.data_ptr() != adapter.tensors[k].data_ptr() for k, t in state.items())
    assert all(".lora_A." in k or ".lora_B." in k for k in adapter.tensors)
    engine.load_adapter(adapter)
    assert engine.adapter_version == 2
    generations, fresh = batch_of(engine, [0.0] * 3, seed=11)
    diff = (trainer.forward(fresh, with_adapter=True).logprobs - fresh.rollout_logprobs).abs()
    assert float((diff * fresh.loss_mask).max()) < 1e-4
    engine.load_adapter(trainer.export_adapter())  # a second load replaces, never stacks
    assert engine.generate(PROMPTS, SamplingParams(max_new_tokens=5, seed=11)) == generations


def test_the_engines_first_adapter_leaves_the_processs_random_state_alone(model_dir):
    """PEFT initialises the engine's LoRA layers at random before the adapter replaces them:
    in the trainer's process that moved the trainer's random stream (its dropout) at a point
    a resumed run does not repeat."""
    engine = HFRolloutEngine(model_dir)
    adapter = make_trainer(model_dir).export_adapter()
    before = torch.get_rng_state()
    engine.load_adapter(adapter)
    assert torch.equal(torch.get_rng_state(), before)


def test_target_and_excluded_modules(model_dir):
    def wrapped(trainer: PeftPolicyTrainer) -> set[str]:
        return {n.split(".")[-1] for n, m in trainer.model.named_modules() if hasattr(m, "lora_A")}

    every = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert wrapped(make_trainer(model_dir)) == every
    assert wrapped(make_trainer(model_dir, target_modules="q_proj,v_proj")) == {
        "q_proj",
        "v_proj",
    }
    assert wrapped(make_trainer(model_dir, exclude_modules="down_proj")) == every - {"down_proj"}


def test_save_writes_a_peft_adapter_and_load_restores_optimizer_state(model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = HFRolloutEngine(model_dir)
    trainer = make_trainer(model_dir)
    _, batch = batch_of(engine, [1.0, -1.0, 0.5])
    trainer.train_step([batch], loss_for(batch, trainer))
    trainer.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter" / "adapter_config.json").is_file()

    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir), tmp_path / "ckpt" / "adapter"
    )
    with torch.no_grad():
        logits = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    mask = batch.loss_mask.bool()
    ours = trainer.forward(batch, with_adapter=True).logprobs
    assert torch.allclose(ours[mask], expected[mask], atol=1e-5)

    restored = make_trainer(model_dir)
    restored.load(tmp_path / "ckpt")
    assert restored.steps == 1
    for t in (trainer, restored):
        t.train_step([batch], loss_for(batch, t))
    for p, q in zip(trainer.params, restored.params, strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    assert restored.scheduler.get_last_lr() == trainer.scheduler.get_last_lr()


@pytest.mark.parametrize(
    ("style", "warmup", "factors"),
    [
        ("constant", 2, [0.5, 1.0, 1.0, 1.0, 1.0]),
        ("linear", 0, [1.0, 0.8, 0.6, 0.4, 0.2]),
        ("cosine", 1, [1.0, 1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5, None]),
    ],
)
def test_lr_schedule(style, warmup, factors):
    settings = OptimizerConfig(lr=1.0, lr_decay_style=style, lr_warmup_iters=warmup)
    for step, expected in enumerate(factors):
        if expected is not None:
            assert lr_factor(settings, 5, step) == pytest.approx(expected)
    floor = OptimizerConfig(lr=1.0, min_lr=0.1, lr_decay_style="cosine")
    assert lr_factor(floor, 4, 4) == pytest.approx(0.1)


def test_memory_release_and_resume_keep_the_model_usable_on_cpu(model_dir):
    engine = HFRolloutEngine(model_dir)
    trainer = make_trainer(model_dir)
    engine.release_memory()
    trainer.release_memory()
    engine.resume_weights()
    engine.resume_memory()
    trainer.resume_memory()
    _, batch = batch_of(engine, [1.0, 0.0, -1.0])
    assert trainer.forward(batch, with_adapter=True).logprobs.shape == batch.loss_mask.shape


def test_factories_build_backends_from_argv(model_dir, tmp_path: Path):
    from trainer.arguments import parse_args
    from trainer.backends import registry

    args = parse_args(
        ["--hf-checkpoint", model_dir, "--prompt-data", "p.jsonl", "--lora-rank", "2",
         "--target-modules", "q_proj,o_proj", "--lr", "3e-4"]
    )  # fmt: skip
    trainer = registry.create_trainer(args, "cpu", total_steps=3)
    assert isinstance(trainer, PeftPolicyTrainer)
    config = trainer.model.peft_config["default"]
    assert config.r == 2 and set(config.target_modules) == {"q_proj", "o_proj"}
    assert config.lora_dropout == 0.0
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)
    assert next(trainer.model.parameters()).dtype == torch.float32
    assert not trainer.model.base_model.model.model.gradient_checkpointing
    assert isinstance(registry.create_rollout(args, "cpu"), HFRolloutEngine)
    checkpointed = registry.create_trainer(
        parse_args(["--hf-checkpoint", model_dir, "--prompt-data", "p.jsonl",
                    "--gradient-checkpointing"]),
        "cpu",
        total_steps=3,
    )  # fmt: skip
    assert checkpointed.model.base_model.model.model.gradient_checkpointing
    first_only = registry.create_trainer(
        parse_args(["--hf-checkpoint", model_dir, "--prompt-data", "p.jsonl",
                    "--gradient-checkpointing", "--gradient-checkpointing-layers", "1"]),
        "cpu",
        total_steps=3,
    )  # fmt: skip
    layers = first_only.model.get_base_model().get_decoder().layers
    assert [layer.gradient_checkpointing for layer in layers] == [True, False]


def test_choosing_the_checkpointed_layers_needs_a_list_of_decoder_layers():
    class Model(torch.nn.Module):
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict) -> None:
            pass

        def get_decoder(self) -> torch.nn.Module:
            return torch.nn.Module()

    _enable_activation_checkpointing(Model())  # every layer: transformers' own call
    with pytest.raises(ValueError, match="--gradient-checkpointing-layers: Model has no list"):
        _enable_activation_checkpointing(Model(), 2)


def saved_for_backward(trainer: PeftPolicyTrainer, batch: TrainBatch) -> int:
    """Bytes a training step keeps for backward outside checkpointed layers (a checkpoint's own
    saved-tensor hooks take what it recomputes, so these see only what stays)."""
    saved: list[int] = []

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        trainer.train_step([batch], mean_logprob_loss)
    return sum(saved)


def test_checkpointing_the_first_layers_only_keeps_the_others_activations(model_dir):
    """``--gradient-checkpointing-layers N``: the first N decoder layers recompute their
    activations, the rest keep theirs, so a step holds more than with every layer recomputed
    and less than with none; 0 of them is no checkpointing at all (transformers' hooks, which
    make the embeddings' output require gradients, stay off). The gradients are the same
    either way (above)."""
    lora, optim = LoraConfig(lora_rank=4, lora_alpha=8.0), OptimizerConfig(lr=1e-2)
    (batch,) = micro_batches([48])
    held = {
        layers: saved_for_backward(
            PeftPolicyTrainer(
                model_dir, lora, optim, total_steps=1,
                gradient_checkpointing=layers is not None,
                checkpointed_layers=-1 if layers is None else layers,
            ),
            batch,
        )
        for layers in (None, 0, 1, -1)
    }  # fmt: skip
    assert held[-1] < held[1] < held[0] == held[None]


def test_log_probs_chunk_size_chunks_without_changing_the_values(model_dir) -> None:
    """miles' --log-probs-chunk-size: tokens per chunk of the log-prob computation."""
    from trainer.arguments import parse_args
    from trainer.backends import registry
    from trainer.grpo.logprob_chunks import DEFAULT_CHUNK_ROWS

    argv = ["--hf-checkpoint", model_dir, "--prompt-data", "p.jsonl", "--seed", "0"]
    default = registry.create_trainer(parse_args(argv), "cpu", total_steps=1)
    chunked = registry.create_trainer(
        parse_args([*argv, "--log-probs-chunk-size", "3"]), "cpu", total_steps=1
    )
    assert (default.logprob_chunk_rows, chunked.logprob_chunk_rows) == (DEFAULT_CHUNK_ROWS, 3)
    ids = torch.tensor([[3, 5, 7, 9, 11, 4, 6, 8], [2, 4, 6, 8, 10, 12, 3, 5]])
    mask = torch.zeros(2, 7)
    mask[:, 2:] = 1.0
    batch = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), loss_mask=mask)
    expected = default.forward(batch, with_adapter=True, with_entropy=True)
    got = chunked.forward(batch, with_adapter=True, with_entropy=True)
    torch.testing.assert_close(got.logprobs, expected.logprobs)
    torch.testing.assert_close(got.entropy, expected.entropy)


class FullLogitsTrainer(PeftPolicyTrainer):
    """The trainer as it was before `trainer.grpo.logprobs`: float32 log-softmax over full
    logits, on every position (the loss masks them)."""

    def _forward(self, batch: TrainBatch, with_entropy: bool, layout: object) -> ForwardOutput:
        logits = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        scaled = logits[:, :-1].float() / self.temperature
        logprobs = scaled.log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        entropy = None
        if with_entropy:
            with torch.set_grad_enabled(self.entropy_grad and torch.is_grad_enabled()):
                entropy = entropy_from_logits(scaled)
        return ForwardOutput(logprobs=logprobs, entropy=entropy)


@pytest.mark.parametrize(
    ("trainer_class", "options", "targets"),
    [
        (FullLogitsTrainer, {}, "all-linear"),
        (PeftPolicyTrainer, {"gradient_checkpointing": True}, "all-linear"),
        (
            PeftPolicyTrainer,
            {"gradient_checkpointing": True, "checkpointed_layers": 1},
            "all-linear",
        ),
        (FullLogitsTrainer, {}, "q_proj,lm_head"),
    ],
    ids=[
        "full-logits",
        "gradient-checkpointing",
        "first-layer-checkpointed",
        "adapted-output-layer",
    ],
)
def test_optimizer_step_equals_the_reference_computation(
    model_dir, trainer_class, options, targets
):
    """Chunked log-probabilities on response tokens only, with or without activation
    checkpointing, take the step the full-logits computation takes (entropy bonus included);
    an output layer with an adapter goes through the model's own forward."""
    engine = HFRolloutEngine(model_dir)
    settings = LoraConfig(lora_rank=4, lora_alpha=8.0, target_modules=targets)
    optim = OptimizerConfig(lr=5e-2)
    config = GRPOConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01)
    common = {"total_steps": 10, "temperature": 0.8, "entropy_grad": True}
    ours = PeftPolicyTrainer(model_dir, settings, optim, **common)
    other = trainer_class(model_dir, settings, optim, **common, **options)
    assert ours.plain_head == (targets == "all-linear")
    generations = engine.generate(PROMPTS * 2, SamplingParams(max_new_tokens=5, seed=6))
    batch = pack(generations, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0], pad_id=0)
    for _ in range(2):  # the second step starts from a trained adapter
        loss_for(batch, ours)
        a = ours.train_step([batch], GRPOLoss(config, Normalizer.from_masks([batch.loss_mask])))
        b = other.train_step([batch], GRPOLoss(config, Normalizer.from_masks([batch.loss_mask])))
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
        for key in ("pg_loss", "kl", "entropy", "ppo_ratio"):
            assert a.metrics[key] == pytest.approx(b.metrics[key], rel=1e-4, abs=1e-6)
        for p, q in zip(ours.params, other.params, strict=True):
            # gradients, not weights: Adam turns rounding noise on a zero gradient into +-lr
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7)
            with torch.no_grad():
                q.copy_(p)


def test_bf16_training_computes_the_adapter_in_bf16_as_the_engine_serves_it(model_dir):
    """bf16 keeps a float32 adapter for Adam but computes it in bf16 (autocast), as the
    engines serve it (SGLang, and the transformers engine, which holds it in bf16); upcasting
    each LoRA input instead costs a float32 activation copy per layer and differs by ~0.01."""
    engine = HFRolloutEngine(model_dir)
    trainer = PeftPolicyTrainer(
        model_dir, LoraConfig(lora_rank=4, lora_alpha=8.0), OptimizerConfig(lr=1e-3),
        total_steps=1, dtype="bf16",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    assert {p.dtype for p in trainer.params} == {torch.float32}
    _, batch = batch_of(engine, [1.0, 0.0, -1.0])
    trained = trainer.forward(batch, with_adapter=True).logprobs
    bf16_engine = HFRolloutEngine(model_dir, dtype="bf16")
    adapter = trainer.export_adapter()
    assert {t.dtype for t in adapter.tensors.values()} == {torch.bfloat16}  # the engine's dtype
    bf16_engine.load_adapter(adapter)
    scored = torch.tensor(bf16_engine.score(batch.input_ids[0].tolist())[0])
    response = batch.loss_mask[0] > 0
    torch.testing.assert_close(scored[response], trained[0][response], rtol=0, atol=1e-5)
