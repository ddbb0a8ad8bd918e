"""Log-probabilities and entropies of sampled tokens, chunk by chunk over the rows.

The naive ``log_softmax(logits.float() / T).gather(...)`` holds several ``[tokens, vocab]``
float32 tensors at once (the upcast, the log-softmax, the softmax for the entropy, and the
copies autograd keeps for backward): with Qwen's 151,936-token vocabulary that is 0.6 MB per
token per tensor, about 5 GB each for one 8,192-token response. Here each chunk of rows is
turned into logits (from hidden states through the output layer's weight, so the full logits
never exist, or taken from given logits), upcast to float32, reduced with ``logsumexp`` and
dropped. Backward (a `torch.autograd.Function`) recomputes one chunk's logits at a time from
the saved inputs and per-row ``logsumexp``: peak extra memory is a few chunks, whatever the
length, at the price of one more output-layer matrix product.
"""

from __future__ import annotations

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
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = inputs.shape[0]
        logprobs = torch.empty(rows, dtype=torch.float32, device=inputs.device)
        entropy = torch.zeros(
            rows if with_entropy else 0, dtype=torch.float32, device=inputs.device
        )
        lse = torch.empty(rows, dtype=torch.float32, device=inputs.device)
        for start in range(0, rows, chunk_rows):
            end = start + chunk_rows
            scaled = _scaled_logits(inputs[start:end], weight, temperature)
            lse[start:end] = torch.logsumexp(scaled, dim=-1)
            picked = scaled.gather(-1, targets[start:end].unsqueeze(-1)).squeeze(-1)
            logprobs[start:end] = picked - lse[start:end]
            if with_entropy:
                scaled -= lse[start:end].unsqueeze(-1)  # log-probabilities, in place
                entropy[start:end] = -(scaled.exp() * scaled).sum(dim=-1)
        ctx.save_for_backward(inputs, weight, targets, lse, entropy)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
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
        with_entropy_grad = grad_entropy is not None and entropy.numel() > 0
        for start in range(0, inputs.shape[0], ctx.chunk_rows):
            end = start + ctx.chunk_rows
            rows = inputs[start:end]
            # d logp_t / dz = onehot(t) - p;  d H / dz = -p (log p + H);  z = logits / T
            log_p = _scaled_logits(rows, weight, ctx.temperature)
            log_p -= lse[start:end].unsqueeze(-1)
            probs = log_p.exp()
            grad = None
            if with_entropy_grad:
                log_p += entropy[start:end].unsqueeze(-1)
                log_p *= probs
                grad = log_p.mul_(-grad_entropy[start:end].unsqueeze(-1))
            del log_p
            if grad_logprobs is not None:
                g = grad_logprobs[start:end].unsqueeze(-1)
                probs.mul_(-g).scatter_add_(-1, targets[start:end].unsqueeze(-1), g)
                grad = probs if grad is None else grad.add_(probs)
            del probs
            if grad is None:
                continue
            if ctx.temperature != 1.0:
                grad /= ctx.temperature
            grad = grad.to(inputs.dtype)
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
        return grad_inputs, grad_weight, None, None, None, None


def token_logprobs(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(logits / temperature)`` at `targets`, and the softmax's entropy, float32.

    `inputs` is ``[rows, vocab]`` logits, or ``[rows, hidden]`` hidden states when `weight`
    (the output layer's ``[vocab, hidden]`` matrix, no bias) turns them into logits. `targets`
    is ``[rows]``. Returns ``[rows]`` tensors; the entropy (None unless `with_entropy`) carries
    a gradient only with `entropy_grad`.
    """
    if inputs.dim() != 2 or targets.shape != inputs.shape[:1]:
        raise ValueError(
            f"inputs {tuple(inputs.shape)} and targets {tuple(targets.shape)}: expected "
            "[rows, features] and [rows]"
        )
    logprobs, entropy = _SelectiveLogSoftmax.apply(
        inputs, weight, targets, temperature, chunk_rows, with_entropy
    )
    if not with_entropy:
        return logprobs, None
    return logprobs, entropy if entropy_grad else entropy.detach()
