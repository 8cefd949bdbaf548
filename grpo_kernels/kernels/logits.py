"""The caller already holds logits [B, T, V] (any float dtype, any row strides): read them tile by tile
in their own dtype, never making an upcast or log_softmax copy. Forward writes O(tokens); backward
writes the one [B, T, V] tensor it must, dLoss/dlogits."""

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .tiles import load_row_stats, load_targets, online_softmax_init, online_softmax_result, online_softmax_update, softmax_grad_tile


@triton.jit
def _row_offsets(rows, T, stride_b, stride_t):
    # row = b * T + t; strided so that a logits[:, :-1] slice is read in place
    return (rows // T).to(tl.int64) * stride_b + (rows % T).to(tl.int64) * stride_t


@triton.jit
def _logits_forward_kernel(
    logits_ptr, targets_ptr, logps_ptr, entropy_ptr, lse_ptr, N, T, V, stride_b, stride_t, inv_tau,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    row_start = _row_offsets(rows, T, stride_b, stride_t)
    targets = load_targets(targets_ptr, rows, row_ok, V)
    run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        ok = row_ok[:, None] & col_ok[None, :]
        z = tl.load(logits_ptr + row_start[:, None] + cols[None, :], mask=ok, other=0.0).to(tl.float32) * inv_tau
        run_max, sum_exp, sum_exp_z, target_z = online_softmax_update(
            run_max, sum_exp, sum_exp_z, target_z, z, cols[None, :] == targets[:, None], col_ok[None, :], 1)
    logps, entropy, lse = online_softmax_result(run_max, sum_exp, sum_exp_z, target_z)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit
def _logits_backward_kernel(
    logits_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, grad_logits_ptr,
    N, T, V, stride_b, stride_t, inv_tau,
    HAS_ENT_GRAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    row_start = _row_offsets(rows, T, stride_b, stride_t)
    targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok, V,
                                                 HAS_ENT_GRAD)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        ok = row_ok[:, None] & col_ok[None, :]
        z = tl.load(logits_ptr + row_start[:, None] + cols[None, :], mask=ok, other=0.0).to(tl.float32) * inv_tau
        dz = softmax_grad_tile(z, cols[None, :] == targets[:, None], col_ok[None, :], lse[:, None],
                               entropy[:, None], g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD)
        out = grad_logits_ptr + rows.to(tl.int64)[:, None] * V + cols[None, :]
        tl.store(out, dz.to(grad_logits_ptr.dtype.element_ty), mask=ok)


def logits_forward(logits: torch.Tensor, targets: torch.Tensor, temperature: float, config: KernelConfig,
                   interpreted: bool):
    B, T, V = logits.shape
    N = B * T
    logps = torch.empty(B, T, dtype=torch.float32, device=logits.device)
    entropy = torch.empty_like(logps)
    lse = torch.empty_like(logps)
    if N > 0:
        _logits_forward_kernel[(triton.cdiv(N, config.block_n),)](
            logits, targets, logps, entropy, lse, N, T, V, logits.stride(0), logits.stride(1), 1.0 / temperature,
            **config.launch_options(interpreted))
    return logps, entropy, lse


def logits_backward(grad_logps, grad_entropy, logits, targets, lse, entropy, temperature: float,
                    config: KernelConfig, interpreted: bool):
    B, T, V = logits.shape
    N = B * T
    grad_logits = torch.empty(B, T, V, dtype=logits.dtype, device=logits.device)
    if N > 0:
        g = grad_logps.float().contiguous()
        e = grad_entropy.float().contiguous() if grad_entropy is not None else g
        _logits_backward_kernel[(triton.cdiv(N, config.block_n),)](
            logits, targets, lse, entropy, g, e, grad_logits, N, T, V, logits.stride(0), logits.stride(1),
            1.0 / temperature, HAS_ENT_GRAD=grad_entropy is not None,
            **config.launch_options(interpreted))
    return grad_logits
