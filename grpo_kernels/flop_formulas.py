"""What torch.utils.flop_counter.FlopCounterMode counts for the library's custom ops (ops.py).

FlopCounterMode (the usual way to measure a training step's FLOPs for MFU) counts the aten matmuls it sees. The
fused backends run the head's GEMMs inside custom ops, which it does not look into: a loss step counted 0 FLOPs
on every backend but `reference` (which materialises the logits with plain matmuls), silently. Each op here counts
the matmuls the same step does on the reference: 2 N H V for the logits of N head rows, and 2 N H V more for each
gradient asked of the head (hidden's, the weight's); a bias is an addition, not a matmul, as FlopCounterMode counts
it. The recomputation a fused backward does (the logits again, instead of saving [N, V]) is the memory saved, not
model work, and is not counted, so the count is the same whichever backend runs the step."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch.utils.flop_counter import register_flop_formula

Shape = Sequence[int]


def _head_matmul(hidden: Shape, weight: Shape) -> int:
    """2 N H V: the logits of hidden's N rows [N, H] under the head [V, H] (a shard's V on a vocabulary shard)."""
    return 2 * hidden[0] * hidden[-1] * weight[0]


def _forward(hidden: Shape, weight: Shape, *args: object, **kwargs: object) -> int:
    return _head_matmul(hidden, weight)


def _gradients(hidden: Shape, weight: Shape, needs_hidden_grad: bool, needs_weight_grad: bool) -> int:
    return (int(needs_hidden_grad) + int(needs_weight_grad)) * _head_matmul(hidden, weight)


def _backward(grad_logps: Shape, grad_entropy: Optional[Shape], hidden: Shape, weight: Shape, bias, head_constants,
              targets, lse, entropy, backend, workspace_bytes, needs_hidden_grad: bool, needs_weight_grad: bool,
              *args: object, **kwargs: object) -> int:
    return _gradients(hidden, weight, needs_hidden_grad, needs_weight_grad)


def _one_pass(hidden: Shape, weight: Shape, bias, head_constants, targets, mask, advantages, token_weights,
              entropy_weights, old_logps, ref_logps, importance_ratio, config, backend, workspace_bytes,
              needs_hidden_grad: bool, needs_weight_grad: bool, *args: object, **kwargs: object) -> int:
    # the ONE_PASS route computes the gradients in its forward; its backward (attach_grads) only scales them
    return _head_matmul(hidden, weight) + _gradients(hidden, weight, needs_hidden_grad, needs_weight_grad)


def register() -> None:
    """Once, after ops.py has defined the ops (a second registration of an op is an error in torch)."""
    ops = torch.ops.grpo_kernels
    register_flop_formula([ops.linear_logprobs, ops.linear_grpo_token_terms])(_forward)
    register_flop_formula(ops.linear_logprobs_backward)(_backward)
    register_flop_formula(ops.one_pass_token_level)(_one_pass)
