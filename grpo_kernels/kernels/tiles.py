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
def logits_tile(a_ptr, a_start, n_a, stride_a, b_ptr, b_start, n_b, stride_b, bias_ptr, K, inv_tau, cap_scale,
                HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                VOCAB_AXIS: tl.constexpr):
    """transform(a[rows] @ b[cols]^T + bias) as a float32 [BLOCK_A, BLOCK_B] tile, rows = a_start + arange(BLOCK_A)
    (of n_a), cols = b_start + arange(BLOCK_B) (of n_b): one operand is the hidden states and the other the LM
    head; VOCAB_AXIS (0 or 1) says which axis is the vocabulary (the bias's axis). The tensor-core M dimension is
    BLOCK_A. Entries past n_a / n_b hold finite values of the block's first row, which the caller masks out.

    Register economy (the tile's softmax math needs the registers): rows past the end read the block's first row
    instead of being masked, and K is a multiple of BLOCK_K (the launcher pads H otherwise, launch.py), so no load
    is masked and no [rows, K] mask stays live across the loop; the two row blocks get 64-bit bases (N x H and V x H may
    exceed 2^31 elements) and 32-bit offsets inside them."""
    ks = tl.arange(0, BLOCK_K)
    a_rows = tl.where(a_start + tl.arange(0, BLOCK_A) < n_a, tl.arange(0, BLOCK_A), 0)
    b_rows = tl.where(b_start + tl.arange(0, BLOCK_B) < n_b, tl.arange(0, BLOCK_B), 0)
    a_ptrs = a_ptr + tl.cast(a_start, tl.int64) * stride_a + (a_rows[:, None] * stride_a + ks[None, :])
    b_ptrs = b_ptr + tl.cast(b_start, tl.int64) * stride_b + (b_rows[:, None] * stride_b + ks[None, :])
    acc = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
        if UPCAST:  # the CPU interpreter mis-computes 16-bit dots; it upcasts first
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if HAS_BIAS:
        if VOCAB_AXIS == 0:
            acc += tl.load(bias_ptr + a_start + a_rows).to(tl.float32)[:, None]
        else:
            acc += tl.load(bias_ptr + b_start + b_rows).to(tl.float32)[None, :]
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
    return softmax_grad_from_p(p, log_p, is_target, col_ok, lse, entropy, g, e, inv_tau, HAS_ENT_GRAD, cap_scale,
                               SOFTCAP)


@triton.jit
def softmax_grad_from_p(p, log_p, is_target, col_ok, lse, entropy, g, e, inv_tau, HAS_ENT_GRAD: tl.constexpr,
                        cap_scale, SOFTCAP: tl.constexpr):
    """softmax_grad_tile's formula from a tile's probabilities p (0 off-vocab) and their logs (finite wherever
    col_ok; the logits are log_p + lse), however they were obtained."""
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
    and target logit. z must be finite where col_ok is False (p is 0 there, so p * z is 0), and is_target False.
    One masked copy of the tile and one of p: the fewest tile-sized temporaries (registers on Hopper)."""
    new_max, sum_exp, sum_exp_z, target_z, _ = online_softmax_step(run_max, sum_exp, sum_exp_z, target_z, z,
                                                                   is_target, col_ok, VOCAB_AXIS)
    return new_max, sum_exp, sum_exp_z, target_z


@triton.jit
def online_softmax_step(run_max, sum_exp, sum_exp_z, target_z, z, is_target, col_ok, VOCAB_AXIS: tl.constexpr):
    """online_softmax_update, also returning the tile's p = exp(z - new max) (0 where col_ok is False), which
    the fold computes anyway: a kernel storing it pays no exponential more."""
    masked = tl.where(col_ok, z, float("-inf"))
    new_max = tl.maximum(run_max, tl.max(masked, VOCAB_AXIS))
    rescale = tl.exp(run_max - new_max)
    p = tl.exp(masked - tl.expand_dims(new_max, VOCAB_AXIS))
    sum_exp = sum_exp * rescale + tl.sum(p, VOCAB_AXIS)
    sum_exp_z = sum_exp_z * rescale + tl.sum(p * z, VOCAB_AXIS)
    target_z += tl.sum(tl.where(is_target, z, 0.0), VOCAB_AXIS)
    return new_max, sum_exp, sum_exp_z, target_z, p


@triton.jit
def load_targets(targets_ptr, rows, row_ok, V):
    """Target ids as int32, -1 for an id outside [0, V) (a vocabulary shard's, or a row past the end): a tile's
    columns past V are never a target. int32, because compared against a whole tile of vocabulary ids, int64
    targets would widen the tile's ids to 64 bits, two registers an element (spills on Hopper)."""
    targets = tl.load(targets_ptr + rows, mask=row_ok, other=-1)
    return tl.where((targets >= 0) & (targets < V), targets, -1).to(tl.int32)


@triton.jit
def load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok, V, HAS_ENT_GRAD: tl.constexpr):
    """What the backward needs per token: target, lse, entropy, g = dLoss/dlp, e = dLoss/dent (0 off-range)."""
    targets = load_targets(targets_ptr, rows, row_ok, V)
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
