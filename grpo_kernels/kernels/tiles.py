"""@triton.jit helpers shared by the forward and backward kernels."""

import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)


def head_transform_args(head) -> tuple[float, float, bool]:
    """(inv_tau, cap_scale, SOFTCAP) of the kernels for a grpo_kernels.head.LMHead (its `logit_constants`; 1.0 and
    SOFTCAP=False for an uncapped head, which compiles to the plain kernels). Every constant the kernels multiply
    by comes from here: one derived in a kernel would be held in a register across its loops (a spill on Hopper)."""
    inv_tau, cap_scale = head.logit_constants
    return inv_tau, 1.0 if cap_scale is None else cap_scale, cap_scale is not None


@triton.jit
def transform_logits(z, inv_tau, cap_scale, SOFTCAP: tl.constexpr):
    """Raw logits (h W^T + b) -> the softmax's logits: inv_tau * tanh(cap_scale * z) with SOFTCAP, else inv_tau * z
    (tanh(x) = 2 sigmoid(2x) - 1)."""
    if SOFTCAP:
        x = z * cap_scale
        return (2.0 * tl.sigmoid(x + x) - 1.0) * inv_tau
    return z * inv_tau


@triton.jit
def raw_logits_grad(dlogits, logits, inv_tau, cap_scale, SOFTCAP: tl.constexpr):
    """dLoss/d(raw logits) from dLoss/d(logits): the chain rule through `transform_logits`; with SOFTCAP its slope
    inv_tau cap_scale (1 - t^2) comes from the logits themselves (inv_tau t = logits)."""
    if SOFTCAP:
        return dlogits * cap_scale * (inv_tau - logits * logits * (1.0 / inv_tau))
    return dlogits * inv_tau


@triton.jit
def logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden, stride_weight,
                inv_tau, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                VOCAB_MAJOR: tl.constexpr = False, cap_scale=1.0, SOFTCAP: tl.constexpr = False):
    """transform(hidden[rows] @ weight[cols]^T + bias[cols]) as a float32 [BLOCK_N, BLOCK_V] tile, or its
    transpose [BLOCK_V, BLOCK_N] when VOCAB_MAJOR (the tensor-core M dimension is then the vocabulary,
    so a tile can be only 16 tokens wide)."""
    if VOCAB_MAJOR:
        acc = tl.zeros((BLOCK_V, BLOCK_N), dtype=tl.float32)
    else:
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
        if VOCAB_MAJOR:
            acc = tl.dot(w, tl.trans(h), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(h, tl.trans(w), acc, input_precision=PRECISION)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        if VOCAB_MAJOR:
            acc += bias[:, None]
        else:
            acc += bias[None, :]
    return transform_logits(acc, inv_tau, cap_scale, SOFTCAP)


@triton.jit
def softmax_grad_tile(z, is_target, col_ok, lse, entropy, g, e, inv_tau, HAS_ENT_GRAD: tl.constexpr, cap_scale=1.0,
                      SOFTCAP: tl.constexpr = False):
    """dLoss/d(raw logits) = (g (onehot - p) - e p (log p + ent)) / tau for one tile of logits z (times the
    soft-cap's slope with SOFTCAP); 0 off-vocab.
    Every argument is already broadcast against z (either orientation); a target outside the weight's
    vocabulary (a shard) matches no column, so that token gets no one-hot term."""
    log_p = z - lse
    p = tl.where(col_ok, tl.exp(log_p), 0.0)
    dz = tl.where(is_target, g, 0.0) - g * p
    if HAS_ENT_GRAD:
        dz -= e * p * tl.where(col_ok, log_p + entropy, 0.0)
    # the logits again from log_p (alive anyway), not z: one tile fewer in registers (a spill on Hopper otherwise)
    return raw_logits_grad(dz, log_p + lse, inv_tau, cap_scale, SOFTCAP)


@triton.jit
def online_softmax_init(BLOCK_N: tl.constexpr):
    """Running max, sum of exp, sum of exp * z and target logit of BLOCK_N rows before any tile."""
    zeros = tl.zeros((BLOCK_N,), dtype=tl.float32)
    return tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32), zeros, zeros, zeros


@triton.jit
def online_softmax_result(run_max, sum_exp, sum_exp_z, target_z):
    """(log-prob of the target, entropy, lse) from the running statistics of every tile."""
    lse = run_max + tl.log(sum_exp)
    return target_z - lse, lse - sum_exp_z / sum_exp, lse


@triton.jit
def online_softmax_update(run_max, sum_exp, sum_exp_z, target_z, z, is_target, col_ok, VOCAB_AXIS: tl.constexpr):
    """Fold one tile of scaled logits (vocabulary along VOCAB_AXIS; is_target and col_ok broadcast against
    it) into each token's running max, sum of exp(z - max), sum of exp(z - max) * z (for the entropy)
    and target logit."""
    z_or_zero = tl.where(col_ok, z, 0.0)
    new_max = tl.maximum(run_max, tl.max(tl.where(col_ok, z, float("-inf")), VOCAB_AXIS))
    rescale = tl.exp(run_max - new_max)
    p = tl.where(col_ok, tl.exp(z - tl.expand_dims(new_max, VOCAB_AXIS)), 0.0)
    sum_exp = sum_exp * rescale + tl.sum(p, VOCAB_AXIS)
    sum_exp_z = sum_exp_z * rescale + tl.sum(p * z_or_zero, VOCAB_AXIS)
    target_z += tl.sum(tl.where(is_target, z_or_zero, 0.0), VOCAB_AXIS)
    return new_max, sum_exp, sum_exp_z, target_z


@triton.jit
def load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok, HAS_ENT_GRAD: tl.constexpr):
    """What the backward needs per token: target, lse, entropy, g = dLoss/dlp, e = dLoss/dent (0 off-range)."""
    targets = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    entropy = tl.load(entropy_ptr + rows, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)
    e = g
    if HAS_ENT_GRAD:
        e = tl.load(e_ptr + rows, mask=row_ok, other=0.0)
    return targets, lse, entropy, g, e


@triton.jit
def online_softmax_merge(run_max, sum_exp, sum_exp_z, target_z, part_max, part_sum_exp, part_sum_exp_z,
                         part_target_z):
    """Fold the statistics of another vocabulary range (same rows) into the running ones. The target logit
    adds: it is 0 in every range that does not hold the target."""
    new_max = tl.maximum(run_max, part_max)
    rescale = tl.exp(run_max - new_max)
    part_rescale = tl.exp(part_max - new_max)
    sum_exp = sum_exp * rescale + part_sum_exp * part_rescale
    sum_exp_z = sum_exp_z * rescale + part_sum_exp_z * part_rescale
    return new_max, sum_exp, sum_exp_z, target_z + part_target_z
