"""@triton.jit helpers shared by the forward and backward kernels."""

import triton
import triton.language as tl


@triton.jit
def logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden, stride_weight,
                inv_tau, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """(hidden[rows] @ weight[cols]^T + bias[cols]) / tau as a float32 [BLOCK_N, BLOCK_V] tile."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < H
        h = tl.load(hidden_ptr + rows[:, None] * stride_hidden + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(weight_ptr + cols[:, None] * stride_weight + ks[None, :],
                    mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:  # the CPU interpreter mis-computes 16-bit dots; it upcasts first
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    return acc * inv_tau


@triton.jit
def softmax_grad_tile(z, cols, col_ok, targets, lse, entropy, g, e, inv_tau, HAS_ENT_GRAD: tl.constexpr):
    """dLoss/d(unscaled logits) = (g (onehot - p) - e p (log p + ent)) / tau for one tile; 0 off-vocab."""
    log_p = z - lse[:, None]
    p = tl.where(col_ok[None, :], tl.exp(log_p), 0.0)
    dz = tl.where(cols[None, :] == targets[:, None], g[:, None], 0.0) - g[:, None] * p
    if HAS_ENT_GRAD:
        dz -= e[:, None] * p * tl.where(col_ok[None, :], log_p + entropy[:, None], 0.0)
    return dz * inv_tau
