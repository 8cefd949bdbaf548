"""The reference backend: the whole [rows, V] logits materialized, the statistics and their gradient by autograd
of the eager formula (grpo_kernels/reference.py). The baseline every benchmark ratio is taken against."""

from __future__ import annotations

import torch

from ..head import LMHead
from ..reference import linear_logits
from .protocol import stats_dtype


class ReferenceBackend:
    def linear_forward(self, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor):
        logps, entropy, lse = _stats(hidden, head.weight, head.bias, head, targets)
        return logps, entropy, lse

    def linear_backward(self, grad_logps, grad_entropy, hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                        lse, entropy, needs_hidden_grad: bool = True, needs_weight_grad: bool = True):
        if not (needs_hidden_grad or needs_weight_grad):
            return None, None, None
        # torch.func: a custom op's implementation runs with autograd off
        has_bias = head.bias is not None
        primals = (hidden, head.weight) + ((head.bias,) if has_bias else ())

        def stats(h, w, *b):
            logps, entropy, _ = _stats(h, w, b[0] if has_bias else None, head, targets)
            return logps, entropy

        _, vjp = torch.func.vjp(stats, *primals)
        grads = vjp((grad_logps.to(lse.dtype),
                     torch.zeros_like(lse) if grad_entropy is None else grad_entropy.to(lse.dtype)))
        grad_hidden, grad_weight = grads[0], grads[1]
        grad_bias = grads[2] if has_bias else None
        return (grad_hidden if needs_hidden_grad else None, grad_weight if needs_weight_grad else None,
                grad_bias if needs_weight_grad else None)


def _stats(hidden, weight, bias, head: LMHead, targets: torch.Tensor):
    """(logps, entropy, lse) of the materialized logits; a target outside [0, V) (another shard's) has no target
    logit here: lp = -lse."""
    logits = head.transform.apply(linear_logits(hidden, weight, bias).to(stats_dtype(hidden.dtype))) / head.temperature
    lse = torch.logsumexp(logits, dim=-1)
    log_probs = logits - lse[:, None]
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    inside = (targets >= 0) & (targets < weight.shape[0])
    target_logit = logits.gather(-1, torch.where(inside, targets, 0)[:, None]).squeeze(-1)
    return torch.where(inside, target_logit, 0.0) - lse, entropy, lse


def backend(workspace_bytes: int = 0) -> ReferenceBackend:
    return ReferenceBackend()
