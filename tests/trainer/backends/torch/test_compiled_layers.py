"""``--torch-compile-layers``: each decoder layer of the PEFT trainer's model compiled with
torch.compile, on the CPU's tiny model (inductor's C++ kernels; on a GPU, Triton's)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from tests.support.tiny_training import away_from_base, mean_logprob_loss, micro_batches
from trainer import tiny
from trainer.backends.base import TrainBatch
from trainer.backends.torch.trainer import PeftPolicyTrainer, _compile_decoder_layers
from trainer.config import LoraConfig, OptimizerConfig

# each micro-batch's response rows are one chunk, of its own length: the chunk's forward for
# its first rows, then dynamic in the rows, and once more where the rows need a gradient
# (training); the logits' gradient for its first rows, then dynamic
LOGPROB_GRAPHS = 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("tiny")
    tiny.build(root / "model", root / "data", seed=3)
    return str(root / "model")


def make_trainer(model_dir: str, **options) -> PeftPolicyTrainer:
    lora, optim = LoraConfig(lora_rank=4, lora_alpha=8.0), OptimizerConfig(lr=1e-2)
    return away_from_base(PeftPolicyTrainer(model_dir, lora, optim, total_steps=10, **options))


def gradients(trainer: PeftPolicyTrainer, batches: list[TrainBatch]) -> dict[str, torch.Tensor]:
    trainer.train_step(batches, mean_logprob_loss)
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def logprobs(trainer: PeftPolicyTrainer, batches: list[TrainBatch]) -> list[torch.Tensor]:
    """The passes a step may take before training: with the adapter (the old policy, or
    ``--check-adapter-sync``'s probe) and without it (the reference policy)."""
    return [
        trainer.forward(batch, with_adapter=with_adapter).logprobs
        for batch in batches
        for with_adapter in (True, False)
    ]


@pytest.mark.parametrize(
    ("options", "graphs"),
    [
        ({"merged": True, "gradient_checkpointing": True}, 9 + LOGPROB_GRAPHS),
        pytest.param({"merged": False}, 6 + LOGPROB_GRAPHS, marks=pytest.mark.slow),
        pytest.param(
            {"merged": True, "gradient_checkpointing": True, "checkpointed_layers": 1},
            10 + LOGPROB_GRAPHS,
            marks=pytest.mark.slow,
        ),
    ],
    ids=["merged-recomputed", "adapter", "merged-first-layer-recomputed"],
)
def test_compiled_layers_compute_as_the_eager_layers_without_graph_breaks(
    model_dir, options, graphs
):
    """Two steps over micro-batches of four lengths, each step's log-probability passes first:
    the same log-probabilities and gradients as the eager model to float32's precision, and
    every layer runs compiled: each kind of pass (training and either log-probability pass,
    twice where the first layer's input differs from the others' in needing a gradient: in
    training without checkpointing, in the log-probability passes with it, through
    transformers' hook on the embeddings) compiles for its first length, then once dynamic in
    the length, and those graphs serve all the layers at every length. Merged and checkpointed
    that is 9 graphs, past dynamo's default limit of 8, where training's would run eagerly
    (`RECOMPILE_LIMIT`); with only the first layer checkpointed
    (``--gradient-checkpointing-layers 1``) the layer that keeps its activations trains
    through one graph more. The log-probabilities' chunks compile with the layers
    (`LOGPROB_GRAPHS`)."""
    torch._dynamo.reset()
    counters.clear()
    eager = make_trainer(model_dir, **options)
    compiled = make_trainer(model_dir, compile_layers=True, **options)
    for lengths in ([10, 14], [12, 17]):
        batches = micro_batches(lengths)
        passes = zip(logprobs(compiled, batches), logprobs(eager, batches), strict=True)
        for compiled_pass, eager_pass in passes:
            torch.testing.assert_close(compiled_pass, eager_pass, atol=1e-5, rtol=1e-4)
        expected, got = gradients(eager, batches), gradients(compiled, batches)
        assert got.keys() == expected.keys() and len(got) > 0
        for name, grad in got.items():
            torch.testing.assert_close(grad, expected[name], atol=1e-5, rtol=1e-4, msg=name)
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == graphs
    assert compiled.merged is None or all(
        layer.kept is None for layer in compiled.merged.layers.values()
    )


@pytest.mark.cuda_gpu
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "recomputed"])
def test_on_a_gpu_compiled_layers_train_the_merged_policy_as_eager_ones_do(
    model_dir, checkpointing
):
    """In bf16 with Triton's kernels: the first step's gradients as the eager layers give them,
    to bf16's precision; a second step (the weights moved, a new length) without a graph
    break."""
    torch._dynamo.reset()
    counters.clear()
    options = {
        "merged": True,
        "dtype": "bf16",
        "device": "cuda",
        "gradient_checkpointing": checkpointing,
    }
    batches = micro_batches([10, 10, 14])
    eager = make_trainer(model_dir, **options)
    compiled = make_trainer(model_dir, compile_layers=True, **options)
    expected, got = gradients(eager, batches), gradients(compiled, batches)
    for name, grad in got.items():
        torch.testing.assert_close(grad, expected[name], atol=1e-3, rtol=2e-2, msg=name)
    compiled.train_step(micro_batches([12, 16]), mean_logprob_loss)
    assert not counters["graph_break"]


def test_a_model_without_a_layer_list_is_refused():
    class Decoder(torch.nn.Module):
        pass

    class Model(torch.nn.Module):
        def get_decoder(self) -> torch.nn.Module:
            return Decoder()

    with pytest.raises(ValueError, match="--torch-compile-layers: Model has no list of decoder"):
        _compile_decoder_layers(Model())
