"""Forward: stream the LM head over vocabulary tiles; per token keep a running max, sum of exp and
sum of exp * z (online log-sum-exp and entropy) and pick out the target logit. Writes only O(tokens)."""

import torch
import triton
import triton.language as tl

from .tiles import logits_tile


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
    run_max = tl.full((BLOCK_N,), float("-inf"), dtype=tl.float32)
    sum_exp = tl.zeros((BLOCK_N,), dtype=tl.float32)
    sum_exp_z = tl.zeros((BLOCK_N,), dtype=tl.float32)
    target_z = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        z = logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden,
                        stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K)
        z_or_zero = tl.where(col_ok[None, :], z, 0.0)
        new_max = tl.maximum(run_max, tl.max(tl.where(col_ok[None, :], z, float("-inf")), 1))
        rescale = tl.exp(run_max - new_max)
        p = tl.where(col_ok[None, :], tl.exp(z - new_max[:, None]), 0.0)
        sum_exp = sum_exp * rescale + tl.sum(p, 1)
        sum_exp_z = sum_exp_z * rescale + tl.sum(p * z_or_zero, 1)
        run_max = new_max
        target_z += tl.sum(tl.where(cols[None, :] == targets[:, None], z_or_zero, 0.0), 1)
    lse = run_max + tl.log(sum_exp)
    tl.store(logps_ptr + rows, target_z - lse, mask=row_ok)
    tl.store(entropy_ptr + rows, lse - sum_exp_z / sum_exp, mask=row_ok)
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
