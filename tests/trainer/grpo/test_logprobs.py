"""Chunked log-probabilities and entropies equal the naive float32 computation."""

from __future__ import annotations

import pytest
import torch

from trainer.grpo.logprobs import token_logprobs
from trainer.grpo.loss import entropy_from_logits

ROWS, HIDDEN, VOCAB = 37, 16, 101


def naive(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    scaled = logits.float() / temperature
    logprobs = scaled.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logprobs, entropy_from_logits(scaled)


def random_case(dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(ROWS, VOCAB, generator=generator) * 3).to(dtype)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    weights = torch.randn(ROWS, generator=generator)
    return logits, targets, weights


@pytest.mark.parametrize("chunk_rows", [1, 8, 37, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_naive_computation(chunk_rows, temperature):
    logits, targets, weights = random_case(torch.float32)
    ours_in = logits.clone().requires_grad_()
    lp, ent = token_logprobs(
        ours_in,
        targets,
        temperature=temperature,
        with_entropy=True,
        entropy_grad=True,
        chunk_rows=chunk_rows,
    )
    ((lp * weights).sum() + (ent * weights.flip(0)).sum()).backward()

    ref_in = logits.clone().requires_grad_()
    ref_lp, ref_ent = naive(ref_in, targets, temperature)
    ((ref_lp * weights).sum() + (ref_ent * weights.flip(0)).sum()).backward()

    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    # the entropy's gradient is the same function written differently: float32 rounding only
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-4, atol=5e-5)


def test_bf16_logits_are_upcast_per_chunk():
    logits, targets, weights = random_case(torch.bfloat16, seed=1)
    ours_in = logits.clone().requires_grad_()
    lp, _ = token_logprobs(ours_in, targets, chunk_rows=8)
    (lp * weights).sum().backward()
    ref_in = logits.clone().requires_grad_()
    ref_lp, _ = naive(ref_in, targets, 1.0)
    (ref_lp * weights).sum().backward()
    assert lp.dtype == torch.float32
    torch.testing.assert_close(lp, ref_lp)
    assert ours_in.grad.dtype == torch.bfloat16
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


def test_hidden_states_through_the_output_layer():
    """With `weight`, gradients reach the hidden states and a trainable output layer."""
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(ROWS, HIDDEN, generator=generator)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    ref_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    ref_head.load_state_dict(head.state_dict())

    ours_in = hidden.clone().requires_grad_()
    lp, ent = token_logprobs(ours_in, targets, weight=head.weight, with_entropy=True, chunk_rows=5)
    lp.sum().backward()
    ref_in = hidden.clone().requires_grad_()
    ref_lp, ref_ent = naive(ref_head(ref_in), targets, 1.0)
    ref_lp.sum().backward()

    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent.detach())
    torch.testing.assert_close(ours_in.grad, ref_in.grad)
    torch.testing.assert_close(head.weight.grad, ref_head.weight.grad)


def test_entropy_carries_no_gradient_unless_asked():
    logits, targets, _ = random_case(torch.float32)
    _, ent = token_logprobs(logits.requires_grad_(), targets, with_entropy=True)
    assert not ent.requires_grad
    lp, none = token_logprobs(logits, targets)
    assert none is None and lp.requires_grad


def test_no_rows_and_bad_shapes():
    lp, ent = token_logprobs(
        torch.zeros(0, VOCAB), torch.zeros(0, dtype=torch.long), with_entropy=True
    )
    assert lp.shape == ent.shape == (0,)
    with pytest.raises(ValueError, match="expected"):
        token_logprobs(torch.zeros(2, 3, VOCAB), torch.zeros(2, 3, dtype=torch.long))


@pytest.mark.slow  # inductor's C++ compile: half a minute on the CPU
def test_compiled_chunks_compute_as_the_eager_ones():
    """`compiled`: the same log-probabilities, entropies and gradients (of the hidden states and
    of a trainable output layer) as the eager chunks, to float32's rounding, with a last chunk
    shorter than the others, in training (entropy with and without its gradient) and in a
    log-probability pass without the entropy."""
    generator = torch.Generator().manual_seed(4)
    hidden = torch.randn(ROWS, HIDDEN, generator=generator)
    targets = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    weights = torch.randn(ROWS, generator=generator)
    head = torch.randn(VOCAB, HIDDEN, generator=generator)
    for entropy_grad in (True, False):
        results = []
        for compiled in (False, True):
            inputs, weight = hidden.clone().requires_grad_(), head.clone().requires_grad_()
            lp, ent = token_logprobs(
                inputs,
                targets,
                weight=weight,
                temperature=0.7,
                with_entropy=True,
                entropy_grad=entropy_grad,
                chunk_rows=8,
                compiled=compiled,
            )
            loss = (lp * weights).sum() + (ent * weights.flip(0)).sum() * entropy_grad
            loss.backward()
            results.append((lp, ent, inputs.grad, weight.grad))
        for got, expected in zip(results[1], results[0], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        eager, _ = token_logprobs(hidden, targets, weight=head, chunk_rows=8)
        compiled, none = token_logprobs(hidden, targets, weight=head, chunk_rows=8, compiled=True)
    assert none is None
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)
