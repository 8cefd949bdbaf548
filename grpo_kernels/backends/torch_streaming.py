"""The streaming algorithm in plain PyTorch: token chunks x vocabulary chunks, online log-sum-exp.

The same algorithm as the Triton kernels, written with torch ops so it runs on any device (by name: `auto` and
the default are the GEMM path, on a CPU too). Extra memory is O(tokens + one [TOKEN_CHUNK, VOCAB_CHUNK] tile): the [tokens, vocab]
logits never exist. The backward recomputes each logits tile and turns it into
`dz = (g * (onehot - p) - e * p * (log p + ent)) / tau` (times the soft-cap's slope for a capped head, see
head.py), then into dH, dW and dbias, accumulating in
float32 (float64 for float64 inputs) in a fixed order, so results are bitwise reproducible.
"""

from __future__ import annotations

import sys
from typing import Optional

import torch

from ..head import LMHead
from .protocol import stats_dtype
from .row_math import OnlineSoftmaxStats, softmax_grad_, target_in_range, target_logit, transform_logits_
from .wide_gemm import gemm_dtype, mm_wide

# A tile of TOKEN_CHUNK x VOCAB_CHUNK float32 values (4 MiB) bounds the extra memory of every pass; the
# passes below keep at most two such tiles alive at once (the logits and their exp), updating in place.
TOKEN_CHUNK = 256
VOCAB_CHUNK = 4096


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], inv_tau: float,
                  cap_scale: Optional[float], compute_dtype: torch.dtype) -> torch.Tensor:
    """Logits of one tile, transformed (soft-capped, scaled by 1/tau), in compute_dtype. The GEMM reads the
    input dtype on tensor cores (CUDA) and writes compute_dtype directly: 16-bit logits would be off by up to
    |z| * 2^-9 before the softmax."""
    operand = gemm_dtype(h)
    z = mm_wide(h.to(operand), w.to(operand).T, compute_dtype)
    if b is not None:
        z += b.to(compute_dtype)
    return transform_logits_(z, inv_tau, cap_scale)  # z is a fresh tile: in place


def linear_forward(hidden: torch.Tensor, head: LMHead,
                   targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hidden [N, H], head.weight [V, H], targets [N] -> (logps, entropy, lse), each [N] in float32/64."""
    weight, bias = head.weight, head.bias
    N, V = hidden.shape[0], weight.shape[0]
    dtype = stats_dtype(hidden.dtype)
    inv_tau, cap_scale = head.logit_constants
    logps = torch.empty(N, dtype=dtype, device=hidden.device)
    entropy = torch.empty_like(logps)
    lse_out = torch.empty_like(logps)
    for n0 in range(0, N, TOKEN_CHUNK):
        n1 = min(n0 + TOKEN_CHUNK, N)
        h, y = hidden[n0:n1], targets[n0:n1]
        stats = OnlineSoftmaxStats(n1 - n0, dtype, hidden.device)
        target_z = torch.zeros(n1 - n0, dtype=dtype, device=hidden.device)
        for v0 in range(0, V, VOCAB_CHUNK):
            v1 = min(v0 + VOCAB_CHUNK, V)
            z = _chunk_logits(h, weight[v0:v1], None if bias is None else bias[v0:v1], inv_tau, cap_scale, dtype)
            stats.update(z)
            inside, column = target_in_range(y, v0, v1)
            target_z += target_logit(z, inside, column)
        lse, ent = stats.lse_and_entropy()
        logps[n0:n1], entropy[n0:n1], lse_out[n0:n1] = target_z - lse, ent, lse
    return logps, entropy, lse_out


def linear_backward(grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor], hidden: torch.Tensor,
                    head: LMHead, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                    needs_hidden_grad: bool = True, needs_weight_grad: bool = True
                    ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(dhidden, dweight, dbias) from per-token upstream gradients, recomputing logits tile by tile.
    A gradient that is not needed is neither computed nor allocated (None in its slot); dbias comes with
    dweight."""
    weight, bias = head.weight, head.bias
    N, V = hidden.shape[0], weight.shape[0]
    dtype = stats_dtype(hidden.dtype)
    inv_tau, cap_scale = head.logit_constants
    g_all = grad_logps.to(dtype)
    e_all = None if grad_entropy is None else grad_entropy.to(dtype)
    grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if needs_hidden_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=dtype, device=weight.device) if needs_weight_grad else None
    grad_bias = torch.zeros(V, dtype=dtype, device=weight.device) if needs_weight_grad and bias is not None else None
    if not (needs_hidden_grad or needs_weight_grad):
        return None, None, None
    for n0 in range(0, N, TOKEN_CHUNK):
        n1 = min(n0 + TOKEN_CHUNK, N)
        h, y = hidden[n0:n1], targets[n0:n1]
        h_c = h.to(dtype)
        g, e = g_all[n0:n1], None if e_all is None else e_all[n0:n1]
        dh = torch.zeros(n1 - n0, hidden.shape[1], dtype=dtype, device=hidden.device) if needs_hidden_grad else None
        for v0 in range(0, V, VOCAB_CHUNK):
            v1 = min(v0 + VOCAB_CHUNK, V)
            w = weight[v0:v1]
            z = _chunk_logits(h, w, None if bias is None else bias[v0:v1], inv_tau, cap_scale, dtype)
            inside, column = target_in_range(y, v0, v1)
            dz = softmax_grad_(z, lse[n0:n1], entropy[n0:n1], g, e, inside, column, inv_tau, cap_scale)
            if dh is not None:
                dh += dz @ w.to(dtype)
            if grad_weight is not None:
                grad_weight[v0:v1] += dz.T @ h_c
            if grad_bias is not None:
                grad_bias[v0:v1] += dz.sum(0)
            del z, dz  # else this tile stays alive beside the next tile and its exp: three tiles, not two
        if grad_hidden is not None:
            grad_hidden[n0:n1] = dh.to(hidden.dtype)
    return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype))


def _row_blocks(logits: torch.Tensor):
    """Yield (b, t0, t1) blocks of at most TOKEN_CHUNK rows of logits [B, T, V], read in place (no copy)."""
    B, T, _ = logits.shape
    for b in range(B):
        for t0 in range(0, T, TOKEN_CHUNK):
            yield b, t0, min(t0 + TOKEN_CHUNK, T)


def logits_forward(logits: torch.Tensor, targets: torch.Tensor,
                   temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, T, V] (any float dtype and row strides, never copied whole), targets [B, T] ->
    (logps, entropy, lse), each [B, T]."""
    B, T, V = logits.shape
    dtype = stats_dtype(logits.dtype)
    inv_tau = 1.0 / temperature
    logps = torch.empty(B, T, dtype=dtype, device=logits.device)
    entropy = torch.empty_like(logps)
    lse_out = torch.empty_like(logps)
    for b, t0, t1 in _row_blocks(logits):
        y = targets[b, t0:t1]
        stats = OnlineSoftmaxStats(t1 - t0, dtype, logits.device)
        target_z = torch.zeros(t1 - t0, dtype=dtype, device=logits.device)
        for v0 in range(0, V, VOCAB_CHUNK):
            v1 = min(v0 + VOCAB_CHUNK, V)
            z = logits[b, t0:t1, v0:v1].to(dtype) * inv_tau
            stats.update(z)
            inside, column = target_in_range(y, v0, v1)
            target_z += target_logit(z, inside, column)
        lse, ent = stats.lse_and_entropy()
        logps[b, t0:t1], entropy[b, t0:t1], lse_out[b, t0:t1] = target_z - lse, ent, lse
    return logps, entropy, lse_out


def logits_backward(grad_logps: torch.Tensor, grad_entropy: Optional[torch.Tensor], logits: torch.Tensor,
                    targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """dLoss/dlogits [B, T, V] in the logits' dtype, written tile by tile."""
    B, T, V = logits.shape
    dtype = stats_dtype(logits.dtype)
    inv_tau = 1.0 / temperature
    g_all = grad_logps.to(dtype)
    e_all = None if grad_entropy is None else grad_entropy.to(dtype)
    grad_logits = torch.empty(B, T, V, dtype=logits.dtype, device=logits.device)
    for b, t0, t1 in _row_blocks(logits):
        y = targets[b, t0:t1]
        g, e = g_all[b, t0:t1], None if e_all is None else e_all[b, t0:t1]
        for v0 in range(0, V, VOCAB_CHUNK):
            v1 = min(v0 + VOCAB_CHUNK, V)
            z = logits[b, t0:t1, v0:v1].to(dtype) * inv_tau
            inside, column = target_in_range(y, v0, v1)
            grad_logits[b, t0:t1, v0:v1] = softmax_grad_(z, lse[b, t0:t1], entropy[b, t0:t1], g, e, inside, column,
                                                       inv_tau)
    return grad_logits


def backend(workspace_bytes: int = 0):
    """This module's functions implement the Protocol (and the logits-input one, protocol.LogitsBackend)."""
    return sys.modules[__name__]
