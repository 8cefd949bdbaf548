"""The one-pass sequence-level route: when it applies to a call, and the call run through it.

A sequence-level loss (GSPO's ratio, vespo's weight) normally takes two passes over the head: every row's statistics,
then the objective by autograd, then the logits again for the gradients. Where the loss is separable by sequence
(objective.sequence_waves_apply) and the backend declares the route (BackendSpec.sequence_waves), the backend runs
waves of whole sequences (backends/gemm.py: stream_sequence_waves) and asks the objective, once a wave's sequences
are complete, for their g: the spec's own objective, differentiated by autograd over the whole batch with the rows
still to come at a placeholder (their old log-probs, or 0), of which only the complete sequences' g is read, the same
as the whole batch's since the loss is separable by sequence.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .backends import AUTO, auto_candidates, get_backend, implementation
from .config import GRPOLossConfig
from .head import LMHead
from .layout import TokenLayout
from .objective import objective_loss, sequence_waves_apply


def _applies(backend: str, config: GRPOLossConfig, head: LMHead, hidden: torch.Tensor, *, kept_sets: bool,
             compiling: bool) -> bool:
    """Whether the route may apply to the call, its store aside (`backend` a name, or 'auto': any that has it)."""
    if backend == AUTO:
        has_route = any(get_backend(name).sequence_waves for name in auto_candidates(kept_sets=kept_sets))
    else:
        has_route = get_backend(backend).sequence_waves
    needs_grads = torch.is_grad_enabled() and (hidden.requires_grad or head.weight_needs_grad())
    return has_route and needs_grads and sequence_waves_apply(config) and not (kept_sets or compiling) \
        and head.shard is None


def longest_sequence(backend: str, config: GRPOLossConfig, layout: TokenLayout, head: LMHead, hidden: torch.Tensor,
                     *, kept_sets: bool, compiling: bool) -> int:
    """The longest sequence's head rows where the route may apply to the call (for `auto` to size the workspace
    by), else 0."""
    if not _applies(backend, config, head, hidden, kept_sets=kept_sets, compiling=compiling):
        return 0
    return max(layout.rows_per_sequence(), default=0)


def sequence_waves(rows_per_sequence: Sequence[int], store_rows: int) -> Optional[list[tuple[int, int]]]:
    """Row ranges (r0, r1) of consecutive whole sequences, each range as many as the store holds; None when a sequence
    is longer than the store (the route does not apply)."""
    waves: list[tuple[int, int]] = []
    start = end = 0
    for length in rows_per_sequence:
        if length > store_rows:
            return None
        if end + length - start > store_rows:
            waves.append((start, end))
            start = end
        end += length
    if end > start:
        waves.append((start, end))
    return waves


def waves_for(backend: str, config: GRPOLossConfig, layout: TokenLayout, head: LMHead, hidden_rows: torch.Tensor,
              workspace_bytes: int, *, kept_sets: bool, compiling: bool) -> Optional[list[tuple[int, int]]]:
    """The waves of whole sequences (head row ranges) the call runs in, or None where the route does not apply: the
    backend lacks it, the loss is not separable by sequence, nothing needs a gradient, the head is a vocabulary shard
    or carries kept-token sets, the graph is compiled, or the store does not hold the longest sequence."""
    if not _applies(backend, config, head, hidden_rows, kept_sets=kept_sets, compiling=compiling):
        return None
    store_rows = implementation(backend, workspace_bytes).sequence_store_rows(hidden_rows.shape[0], head.vocab_size,
                                                                              hidden_rows)
    return sequence_waves(layout.rows_per_sequence(), store_rows)


def sequence_level_in_waves(backend: str, waves: list[tuple[int, int]], hidden_rows: torch.Tensor, head: LMHead,
                            target_rows: torch.Tensor, layout: TokenLayout, advantages: torch.Tensor,
                            config: GRPOLossConfig, old_logps: Optional[torch.Tensor],
                            ref_logps: Optional[torch.Tensor], importance_ratio: Optional[torch.Tensor],
                            num_items_in_batch, workspace_bytes: int
                            ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """(loss, metrics, logps [R]) of the call through `backend`'s waves; the loss carries the gradients, scaled by
    the upstream gradient in the backward (ops.attach_grads)."""
    from . import ops
    from .backends.one_pass import or_empty

    objective_inputs = dict(old_logps=old_logps, ref_logps=ref_logps, importance_ratio=importance_ratio,
                            num_items_in_batch=num_items_in_batch)
    placeholder = layout.per_row(old_logps)

    def wave_grads(r0: int, r1: int, logps: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
        rows = torch.zeros(layout.num_rows, dtype=logps.dtype, device=logps.device) if placeholder is None \
            else placeholder.to(logps.dtype).clone()
        rows[:r1] = logps
        spread = torch.zeros_like(rows)
        spread[:r1] = entropy
        with torch.enable_grad():
            lp = layout.to_grid(rows).requires_grad_()
            loss, _ = objective_loss(lp, layout.to_grid(spread), layout.mask, advantages, config, **objective_inputs)
            (grad,) = torch.autograd.grad(loss, lp)
        return layout.per_row(grad)[r0:r1]

    needs_hidden_grad = hidden_rows.requires_grad
    needs_weight_grad = head.weight_needs_grad()
    plain_head = LMHead(head.weight.detach(), None if head.bias is None else head.bias.detach(), head.temperature,
                        head.transform)
    with torch.no_grad():
        logps, entropy, _, grad_hidden, grad_weight, grad_bias = implementation(
            backend, workspace_bytes).linear_forward_with_sequence_grads(
            hidden_rows.detach(), plain_head, target_rows, waves, wave_grads, needs_hidden_grad, needs_weight_grad)
        loss, metrics = objective_loss(layout.to_grid(logps), layout.to_grid(entropy), layout.mask, advantages,
                                       config, **objective_inputs)
    loss = ops.attach_grads(backend, loss, hidden_rows, head, or_empty(grad_hidden, hidden_rows),
                            or_empty(grad_weight, hidden_rows), or_empty(grad_bias, hidden_rows))
    return loss, metrics, logps
