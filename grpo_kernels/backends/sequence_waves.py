"""A sequence-level loss in one pass on the GEMM path: waves of whole sequences, three GEMMs instead of four.

The two-pass route (backends/gemm.py) takes every row's statistics first and forms the logits again once the
objective has given each token its g = dLoss/dlp. Where the loss is separable by sequence (a sequence's g reads only
that sequence's tokens: objective.sequence_waves_apply) and has no entropy term, a token's gradient with respect to
its raw logits is g times Q = d lp / d z (p - onehot, through the head's transform), and Q needs only the row's own
statistics. So each row's logits go through a float32 scratch once (the logits GEMM, the statistics, Q narrowed to
the GEMM dtype into a compact store); once a wave's sequences are all in the store, their objective gives g and the
gradients come from the store: dH = g (Q W) and dW += Q^T (g h), two GEMMs, the logits never formed again.

The workspace holds the scratch ([scratch_rows, V], float32) and the store ([store_rows, V], the GEMM dtype),
cost_model.paths.sequence_store_layout; the route applies where the store holds the call's longest sequence. Every
dW element is added in wave order, every dH row written once: deterministic, as the two-pass route.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..cost_model.paths import row_segments, sequence_store_layout
from ..head import LMHead
from .gemm import RowOps, WeightGrad, head_operands, targets_by_segment
from .wide_gemm import mm_wide

# (r0, r1, logps [r1], entropy [r1]) -> g [r1 - r0]: the objective's dLoss/dlp of rows r0..r1 (whole sequences),
# given every row's statistics up to r1
WaveGrads = Callable[[int, int, torch.Tensor, torch.Tensor], torch.Tensor]


def sequence_waves(rows_per_sequence: list[int], store_rows: int) -> Optional[list[tuple[int, int]]]:
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


def stream_sequence_waves(hidden: torch.Tensor, head: LMHead, targets: torch.Tensor, waves: list[tuple[int, int]],
                          workspace_bytes: int, rows: RowOps, wave_grads: WaveGrads, *, needs_hidden_grad: bool,
                          needs_weight_grad: bool, gemm_in_input_dtype: Optional[bool] = None):
    """(logps, entropy, lse, dH, dW, dbias) of rows [N, H] in `waves` (sequence_waves of the store that
    cost_model.paths.sequence_store_layout gives the workspace), the gradients from `wave_grads`' g per wave."""
    weight, bias = head.weight, head.bias
    N, H = hidden.shape
    V = weight.shape[0]
    device = hidden.device
    w, b, gemm, wide, inv_tau, cap_scale = head_operands(hidden, head, gemm_in_input_dtype)
    scratch_rows, store_rows = sequence_store_layout(N, V, gemm.itemsize, workspace_bytes, wide.itemsize)

    logps, entropy, lse = (torch.empty(N, dtype=wide, device=device) for _ in range(3))
    grad_hidden = torch.empty_like(hidden) if needs_hidden_grad else None
    grad_weight = WeightGrad(weight, wide) if needs_weight_grad else None
    grad_bias = torch.zeros(V, dtype=wide, device=device) if needs_weight_grad and bias is not None else None
    longest = max((r1 - r0 for r0, r1 in waves), default=0)
    scratch = torch.empty(min(scratch_rows, N), V, dtype=wide, device=device) if N else None
    store = torch.empty(longest, V, dtype=gemm, device=device)
    # Q needs no reduction once the row's statistics are known, so its pass runs, as the statistics', a program per
    # row segment: [rows * k, V / k] views of the scratch and the store (gemm.segment_parts says why)
    segments = row_segments(V, b is not None, rows.min_segment) if rows.stats_parts else 1
    all_segment_targets = targets_by_segment(targets, V, segments) if segments > 1 and N else None
    ones = torch.ones(scratch_rows * segments, dtype=wide, device=device)
    for r0, r1 in waves:
        for c0 in range(r0, r1, scratch_rows):
            c1 = min(c0 + scratch_rows, r1)
            h, y = hidden[c0:c1].to(gemm), targets[c0:c1]
            z = mm_wide(h, w.T, wide, out=scratch[:c1 - c0])
            by_segment = None if all_segment_targets is None else \
                all_segment_targets[c0 * segments:c1 * segments]
            lse_c, ent_c, target_z = rows.stats(z, b, y, inv_tau, cap_scale,
                                                **({} if by_segment is None else {"segment_targets": by_segment}))
            logps[c0:c1], entropy[c0:c1], lse[c0:c1] = target_z - lse_c, ent_c, lse_c
            # Q = d lp / d z (g = 1, no entropy term), in place over the scratch, then kept in the GEMM dtype
            count = (c1 - c0) * segments
            q = rows.grad_(z.view(count, V // segments), b, y if by_segment is None else by_segment,
                           lse_c.repeat_interleave(segments), ent_c.repeat_interleave(segments), ones[:count], None,
                           inv_tau, cap_scale, gemm)
            store[c0 - r0:c1 - r0].view(count, V // segments).copy_(q)
        g = wave_grads(r0, r1, logps[:r1], entropy[:r1]).to(wide)
        q = store[:r1 - r0]
        if grad_hidden is not None:
            grad_hidden[r0:r1] = mm_wide(q, w, wide).mul_(g[:, None])
        if grad_weight is not None:
            grad_weight.add(q, (hidden[r0:r1].to(wide) * g[:, None]).to(gemm))
        if grad_bias is not None:
            grad_bias += mm_wide(q.T, g[:, None].to(gemm), wide).squeeze(1)
    dweight = None if grad_weight is None else grad_weight.result(weight.dtype)
    dbias = None if grad_bias is None else grad_bias.to(bias.dtype)
    return logps, entropy, lse, grad_hidden, dweight, dbias
