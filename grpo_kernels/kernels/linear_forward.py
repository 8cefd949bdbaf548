"""Forward: stream the LM head over vocabulary tiles; per token keep a running max, sum of exp and
sum of exp * z (online log-sum-exp and entropy) and pick out the target logit. Writes only O(tokens).
Two kernels share the stream: one stops at the log-probs, one adds the token-level objective epilogue."""

import torch
import triton
import triton.language as tl

from .tiles import logits_tile, online_softmax_init, online_softmax_result, online_softmax_update
from .token_objective import token_objective


@triton.jit
def _stream_vocab(hidden_ptr, weight_ptr, bias_ptr, rows, row_ok, targets, V, H, stride_hidden, stride_weight,
                  inv_tau, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """(log-prob of the target, entropy, lse) per row, one vocabulary tile at a time."""
    run_max, sum_exp, sum_exp_z, target_z = online_softmax_init(BLOCK_N)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden,
                        stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K)
        run_max, sum_exp, sum_exp_z, target_z = online_softmax_update(run_max, sum_exp, sum_exp_z, target_z, z,
                                                                      cols, col_ok, targets)
    return online_softmax_result(run_max, sum_exp, sum_exp_z, target_z)


@triton.jit
def _linear_logprobs_forward_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, logps_ptr, entropy_ptr, lse_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau,
    HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    targets = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    logps, entropy, lse = _stream_vocab(hidden_ptr, weight_ptr, bias_ptr, rows, row_ok, targets, V, H,
                                        stride_hidden, stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION,
                                        BLOCK_N, BLOCK_V, BLOCK_K)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


def linear_forward(hidden: torch.Tensor, weight: torch.Tensor, bias, targets: torch.Tensor, temperature: float,
                   blocks: dict, upcast: bool, precision: str):
    N, H = hidden.shape
    V = weight.shape[0]
    logps = torch.empty(N, dtype=torch.float32, device=hidden.device)
    entropy = torch.empty_like(logps)
    lse = torch.empty_like(logps)
    if N == 0:
        return logps, entropy, lse
    grid = (triton.cdiv(N, blocks["BLOCK_N"]),)
    _linear_logprobs_forward_kernel[grid](
        hidden, weight, bias if bias is not None else hidden, targets, logps, entropy, lse,
        N, V, H, hidden.stride(0), weight.stride(0), 1.0 / temperature,
        HAS_BIAS=bias is not None, UPCAST=upcast, PRECISION=precision, **blocks,
    )
    return logps, entropy, lse


@triton.jit
def _linear_grpo_forward_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr,
    adv_ptr, token_weight_ptr, entropy_weight_ptr, old_ptr, ref_ptr, rho_ptr, mask_ptr,
    terms_ptr, logps_ptr, entropy_ptr, lse_ptr, grad_ptr, kl_ptr, clip_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau,
    eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
    HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    LOSS_KIND: tl.constexpr, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_RHO: tl.constexpr,
    HAS_DELTA: tl.constexpr, BIAS_CORRECTION: tl.constexpr, HAS_ENTROPY_BONUS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The same vocabulary stream, then the token-level objective in the epilogue: the backward needs only
    the per-token g this writes (and the entropy weight)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    targets = tl.load(targets_ptr + rows, mask=row_ok, other=0)
    logps, entropy, lse = _stream_vocab(hidden_ptr, weight_ptr, bias_ptr, rows, row_ok, targets, V, H,
                                        stride_hidden, stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION,
                                        BLOCK_N, BLOCK_V, BLOCK_K)
    adv = tl.load(adv_ptr + rows, mask=row_ok, other=0.0)
    token_weight = tl.load(token_weight_ptr + rows, mask=row_ok, other=0.0)
    mask = tl.load(mask_ptr + rows, mask=row_ok, other=0.0)
    old = logps
    if HAS_OLD:
        old = tl.load(old_ptr + rows, mask=row_ok, other=0.0)
    ref = logps
    if HAS_REF:
        ref = tl.load(ref_ptr + rows, mask=row_ok, other=0.0)
    rho = adv
    if HAS_RHO:
        rho = tl.load(rho_ptr + rows, mask=row_ok, other=0.0)
    term, grad, kl, low, high = token_objective(
        logps, old, ref, adv, rho, mask, token_weight, eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
        LOSS_KIND, HAS_OLD, HAS_REF, HAS_RHO, HAS_DELTA, BIAS_CORRECTION)
    if HAS_ENTROPY_BONUS:
        term -= tl.load(entropy_weight_ptr + rows, mask=row_ok, other=0.0) * entropy
    tl.store(terms_ptr + rows, term, mask=row_ok)
    tl.store(grad_ptr + rows, grad, mask=row_ok)
    tl.store(logps_ptr + rows, logps, mask=row_ok)
    tl.store(entropy_ptr + rows, entropy, mask=row_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    tl.store(kl_ptr + rows, kl, mask=row_ok)
    tl.store(clip_ptr + rows, low.to(tl.int8) + 2 * high.to(tl.int8), mask=row_ok)


def linear_grpo_forward(hidden, weight, bias, targets, advantages, token_weights, entropy_weights, old_logps,
                        ref_logps, importance_ratio, mask, temperature: float, objective: dict, blocks: dict,
                        upcast: bool, precision: str):
    """Per token [N]: loss terms (summing to the loss), logps, entropy, lse, g = dterm/dlp, kl, clip code
    (bit 0: low-clipped, bit 1: high-clipped)."""
    N, H = hidden.shape
    V = weight.shape[0]
    f32 = dict(dtype=torch.float32, device=hidden.device)
    terms, logps, entropy, lse, grad, kl = (torch.empty(N, **f32) for _ in range(6))
    clip = torch.empty(N, dtype=torch.int8, device=hidden.device)
    if N == 0:
        return terms, logps, entropy, lse, grad, kl, clip
    absent = advantages  # stands in for an optional input that is not given; never read (its flag is off)
    _linear_grpo_forward_kernel[(triton.cdiv(N, blocks["BLOCK_N"]),)](
        hidden, weight, bias if bias is not None else hidden, targets,
        advantages, token_weights, entropy_weights if entropy_weights is not None else absent,
        old_logps if old_logps is not None else absent, ref_logps if ref_logps is not None else absent,
        importance_ratio if importance_ratio is not None else absent, mask,
        terms, logps, entropy, lse, grad, kl, clip,
        N, V, H, hidden.stride(0), weight.stride(0), 1.0 / temperature,
        objective["eps_low"], objective["eps_high"], objective["delta"] if objective["delta"] is not None else 0.0,
        objective["beta"], objective["sapo_pos"], objective["sapo_neg"],
        HAS_BIAS=bias is not None, UPCAST=upcast, PRECISION=precision, LOSS_KIND=objective["loss_kind"],
        HAS_OLD=old_logps is not None, HAS_REF=ref_logps is not None, HAS_RHO=importance_ratio is not None,
        HAS_DELTA=objective["delta"] is not None, BIAS_CORRECTION=objective["bias_correction"],
        HAS_ENTROPY_BONUS=entropy_weights is not None, **blocks,
    )
    return terms, logps, entropy, lse, grad, kl, clip
