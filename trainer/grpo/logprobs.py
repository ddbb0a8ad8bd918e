"""Log-probabilities and entropies of sampled tokens, chunk by chunk over the rows.

The naive ``log_softmax(logits.float() / T).gather(...)`` holds several ``[tokens, vocab]``
float32 tensors at once (the upcast, the log-softmax, the softmax for the entropy, and the
copies autograd keeps for backward): with Qwen's 151,936-token vocabulary that is 0.6 MB per
token per tensor, about 5 GB each for one 8,192-token response. Here each chunk of rows is
turned into logits (from hidden states through the output layer's weight, so the full logits
never exist, or taken from given logits), upcast to float32, reduced with ``logsumexp`` and
dropped. Backward (a `torch.autograd.Function`) recomputes one chunk's logits at a time from
the saved inputs and per-row ``logsumexp``: peak extra memory is a few chunks, whatever the
length, at the price of one more output-layer matrix product. Each of these float32 operations
is a pass over the chunk; `compiled` (the torch backend's ``--torch-compile-layers``) fuses a
chunk's passes, forward and backward, into a few kernels that read its 16-bit logits instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from trainer.grpo.logprob_chunks import DEFAULT_CHUNK_ROWS


def _scaled_logits(
    rows: torch.Tensor, weight: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """A new float32 tensor ``logits / temperature`` of one chunk (never a view of `rows`)."""
    logits = rows if weight is None else rows @ weight.t()
    scaled = logits.float()
    if scaled is rows:
        return scaled / temperature
    return scaled.div_(temperature) if temperature != 1.0 else scaled


def _chunk_forward(
    rows: torch.Tensor,
    weight: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk's log-probabilities at `targets`, its rows' ``logsumexp`` and entropies."""
    scaled = _scaled_logits(rows, weight, temperature)
    lse = torch.logsumexp(scaled, dim=-1)
    logprobs = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logprobs, lse, None
    scaled -= lse.unsqueeze(-1)  # log-probabilities, in place
    return logprobs, lse, -(scaled.exp() * scaled).sum(dim=-1)


def _chunk_logits_grad(
    rows: torch.Tensor,
    weight: torch.Tensor | None,
    targets: torch.Tensor,
    lse: torch.Tensor,
    entropy: torch.Tensor,
    grad_logprobs: torch.Tensor | None,
    grad_entropy: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """The gradient of one chunk's logits, in the inputs' dtype; at least one of the two
    gradients is given.

    ``d logp_t / dz = onehot(t) - p`` and ``d H / dz = -p (log p + H)``, with ``z = logits / T``.
    """
    log_p = _scaled_logits(rows, weight, temperature)
    log_p -= lse.unsqueeze(-1)
    probs = log_p.exp()
    grad = None
    if grad_entropy is not None:
        log_p += entropy.unsqueeze(-1)
        log_p *= probs
        grad = log_p.mul_(-grad_entropy.unsqueeze(-1))
    del log_p  # eager, the float32 temporaries go as soon as they are used, not at the return
    if grad_logprobs is not None:
        g = grad_logprobs.unsqueeze(-1)
        probs.mul_(-g).scatter_add_(-1, targets.unsqueeze(-1), g)
        grad = probs if grad is None else grad.add_(probs)
    del probs
    assert grad is not None
    if temperature != 1.0:
        grad /= temperature
    return grad.to(rows.dtype)


@functools.cache
def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` through ``torch.compile``: the chunk's element-wise passes over its
    ``[rows, vocab]`` logits fused into a few kernels that read them once or twice, instead of
    one float32 pass each. A shorter last chunk compiles it once more, dynamic in the rows
    (dynamo's automatic dynamic shapes)."""
    return torch.compile(function)


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        weight: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_rows: int,
        with_entropy: bool,
        compiled: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = inputs.shape[0]
        logprobs = torch.empty(rows, dtype=torch.float32, device=inputs.device)
        entropy = torch.zeros(
            rows if with_entropy else 0, dtype=torch.float32, device=inputs.device
        )
        lse = torch.empty(rows, dtype=torch.float32, device=inputs.device)
        chunk_forward = _compiled(_chunk_forward) if compiled else _chunk_forward
        for start in range(0, rows, chunk_rows):
            end = start + chunk_rows
            picked, lse[start:end], chunk_entropy = chunk_forward(
                inputs[start:end], weight, targets[start:end], temperature, with_entropy
            )
            logprobs[start:end] = picked
            if chunk_entropy is not None:
                entropy[start:end] = chunk_entropy
        ctx.save_for_backward(inputs, weight, targets, lse, entropy)
        ctx.temperature, ctx.chunk_rows, ctx.compiled = temperature, chunk_rows, compiled
        ctx.set_materialize_grads(False)  # an unused entropy gets no gradient pass
        return logprobs, entropy

    @staticmethod
    def backward(
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[Any, ...]:
        inputs, weight, targets, lse, entropy = ctx.saved_tensors
        need_inputs, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_inputs = torch.zeros_like(inputs) if need_inputs else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_weight else None
        if grad_entropy is not None and entropy.numel() == 0:
            grad_entropy = None
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None, None, None
        logits_grad = _compiled(_chunk_logits_grad) if ctx.compiled else _chunk_logits_grad
        for start in range(0, inputs.shape[0], ctx.chunk_rows):
            end = start + ctx.chunk_rows
            rows = inputs[start:end]
            grad = logits_grad(
                rows,
                weight,
                targets[start:end],
                lse[start:end],
                entropy[start:end],
                None if grad_logprobs is None else grad_logprobs[start:end],
                None if grad_entropy is None else grad_entropy[start:end],
                ctx.temperature,
            )
            if weight is None:
                if grad_inputs is not None:
                    grad_inputs[start:end] = grad
                continue
            if grad_inputs is not None:
                grad_inputs[start:end] = grad @ weight
            if grad_weight is not None:
                grad_weight += (grad.t() @ rows).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_inputs, grad_weight, None, None, None, None, None


def token_logprobs(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(logits / temperature)`` at `targets`, and the softmax's entropy, float32.

    `inputs` is ``[rows, vocab]`` logits, or ``[rows, hidden]`` hidden states when `weight`
    (the output layer's ``[vocab, hidden]`` matrix, no bias) turns them into logits. `targets`
    is ``[rows]``. Returns ``[rows]`` tensors; the entropy (None unless `with_entropy`) carries
    a gradient only with `entropy_grad`. `compiled` computes each chunk through
    ``torch.compile`` (the same values, float32 rounding aside).
    """
    if inputs.dim() != 2 or targets.shape != inputs.shape[:1]:
        raise ValueError(
            f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)}: expected "
            "[rows, features] and [rows]"
        )
    logprobs, entropy = _SelectiveLogSoftmax.apply(
        inputs, weight, targets, temperature, chunk_rows, with_entropy, compiled
    )
    if not with_entropy:
        return logprobs, None
    return logprobs, entropy if entropy_grad else entropy.detach()
