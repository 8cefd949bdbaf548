"""Backward of a trained head in one kernel: each logits tile recomputed once, and dH, dW and dbias formed from the
same dz tile, added into float32 accumulators with atomics. Not bitwise repeatable run to run: several programs
add into each output element, in whatever order they reach it. The registry offers it only as an opt-in backend
(backends/__init__.py: `triton_atomic`, deterministic=False); the default backward is linear_backward.py's, one
writer per element, which also serves this backend when only one gradient is needed (nothing to share).

`_tile_grad_kernel`, one program per [BLOCK_N tokens, BLOCK_V vocabulary] tile of a 2-D grid (walked as one
dimension in groups of GROUP token blocks, so that the programs resident at once share a few token blocks and a
few vocabulary blocks, whose accumulator lines then meet in L2 instead of each going to HBM):
1. one tensor-core GEMM over H recomputes the logits tile (token-major: the dot's M is the token block, wgmma on
   Hopper), the softmax gradient makes dz in registers (exactly zero at rows past N and columns past V);
2. for each BLOCK_K slice of H, a tensor-core dot dz @ W[cols, slice] added into dH[rows, slice]; then for each
   slice dz^T @ h[rows, slice] added into dW[cols, slice] (two loops: one operand's pointers and one result live
   at a time); the adds are reductions in L2 (`red.global.add.f32`: the program does not wait for them); dbias
   gets dz's column sums.

Cost (bf16 on Hopper, configs.py's sm90 "grad_tiles" entry: 128 x 128 tiles, BLOCK_K 64; cost_model.paths's
atomic_tile_backward charges it, the same function as Cut Cross-Entropy's backward):
- launches: 1; programs cdiv(N, 128) x cdiv(V, 128)
- tensor-core work: 3 GEMM-equivalents (the recompute, dH, dW); with the forward's 1, 4
- L2 <-> SM traffic: the operands, 2 N V H (1/BLOCK_N + 1/BLOCK_V) bytes for the recompute and the same again for
  the two contractions; the float32 atomics, 4 N V H (1/BLOCK_V + 1/BLOCK_N) bytes
- extra memory: the float32 dH [N, H] and dW [V, H] accumulators (cast to the input dtype at the end)
"""

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .tiles import head_transform_args, load_row_stats, logits_tile, softmax_grad_tile

# token blocks per program group of the grid (L2 reuse only; no effect on any value beyond the atomics' order)
GROUP_N = 8


@triton.jit
def _tile_grad_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr,
    grad_hidden_ptr, grad_weight_ptr, grad_bias_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
    HAS_BIAS: tl.constexpr,
    HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    """Program (token block, vocabulary block): its tile's contributions to dH, dW and dbias (float32, row
    stride H), added atomically."""
    pid = tl.program_id(0)
    vocab_blocks = tl.cdiv(V, BLOCK_V)
    per_group = GROUP * vocab_blocks
    first_block = (pid // per_group) * GROUP
    group_size = tl.minimum(tl.cdiv(N, BLOCK_N) - first_block, GROUP)
    n_start = (first_block + (pid % per_group) % group_size) * BLOCK_N
    v_start = ((pid % per_group) // group_size) * BLOCK_V

    rows = n_start + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = v_start + tl.arange(0, BLOCK_V)
    col_ok = cols < V
    z = logits_tile(hidden_ptr, n_start, N, stride_hidden, weight_ptr, v_start, V, stride_weight, bias_ptr, H,
                    inv_tau, cap_scale, HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, 1)
    # A row past N holds row n_start's logits (logits_tile); with row n_start's statistics its p is finite, and
    # g = e = 0 make its dz exactly 0: no [BLOCK_N, BLOCK_V] row mask stays live (a spill under triton 3.6).
    stat_rows = n_start + tl.where(row_ok, tl.arange(0, BLOCK_N), 0)
    targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, stat_rows,
                                                 stat_rows < N, V, HAS_ENT_GRAD)
    g = tl.where(row_ok, g, 0.0)
    e = tl.where(row_ok, e, 0.0)
    dz = softmax_grad_tile(z, cols[None, :] == targets[:, None], col_ok[None, :], lse[:, None], entropy[:, None],
                           g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
    if HAS_BIAS:
        tl.atomic_add(grad_bias_ptr + cols, tl.sum(dz, 0), mask=col_ok, sem="relaxed")
    dz = dz.to(hidden_ptr.dtype.element_ty)
    if UPCAST:
        dz = dz.to(tl.float32)
    # Two loops over H, not one: one operand's pointers and one dot's result live at a time (fewer registers)
    _add_products(dz, weight_ptr, v_start, stride_weight, col_ok, grad_hidden_ptr, n_start, row_ok, H, UPCAST,
                  PRECISION, BLOCK_N, BLOCK_V, BLOCK_K)
    _add_products(tl.trans(dz), hidden_ptr, n_start, stride_hidden, row_ok, grad_weight_ptr, v_start, col_ok, H,
                  UPCAST, PRECISION, BLOCK_V, BLOCK_N, BLOCK_K)


@triton.jit
def _add_products(a, operand_ptr, operand_start, stride_operand, operand_ok, out_ptr, out_start, out_ok, H,
                  UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_OUT: tl.constexpr,
                  BLOCK_OPERAND: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[out_start + i, :] += (a @ operand[operand_start + j, :])[i] (float32, row stride H) for the rows with
    out_ok, one BLOCK_K slice of H at a time, by atomic reductions. Operand rows past the end read the block's first
    row: a's columns for them are 0, so they add nothing."""
    ks = tl.arange(0, BLOCK_K)
    safe_rows = tl.where(operand_ok, tl.arange(0, BLOCK_OPERAND), 0)
    operand_ptrs = operand_ptr + tl.cast(operand_start, tl.int64) * stride_operand + (
        safe_rows[:, None] * stride_operand + ks[None, :])
    out_ptrs = out_ptr + tl.cast(out_start, tl.int64) * H + (tl.arange(0, BLOCK_OUT)[:, None] * H + ks[None, :])
    for _ in range(0, H, BLOCK_K):
        operand = tl.load(operand_ptrs)
        if UPCAST:
            operand = operand.to(tl.float32)
        tl.atomic_add(out_ptrs, tl.dot(a, operand, input_precision=PRECISION), mask=out_ok[:, None], sem="relaxed")
        operand_ptrs += BLOCK_K
        out_ptrs += BLOCK_K

def tile_backward(grad_logps, grad_entropy, hidden, head, targets, lse, entropy, config: KernelConfig, upcast: bool,
                  precision: str):
    """(grad_hidden, grad_weight, grad_bias) of a trained head (both gradients: with one, the recompute is shared by
    nothing, and linear_backward.py's kernel does the same work with one writer per element). head: a
    grpo_kernels.head.LMHead; config: the "grad_tiles" table entry."""
    N, H = hidden.shape
    weight, bias = head.weight, head.bias
    V = weight.shape[0]
    # float32 accumulators the tiles add into
    grad_hidden = torch.zeros(N, H, dtype=torch.float32, device=hidden.device)
    grad_weight = torch.zeros(V, H, dtype=torch.float32, device=weight.device)
    grad_bias = torch.zeros(V, dtype=torch.float32, device=weight.device) if bias is not None else None
    if N > 0:
        g = grad_logps.float().contiguous()
        e = grad_entropy.float().contiguous() if grad_entropy is not None else g
        inv_tau, cap_scale, capped = head_transform_args(head)
        grid = (triton.cdiv(N, config.block_n) * triton.cdiv(V, config.block_v),)
        _tile_grad_kernel[grid](
            hidden, weight, bias if bias is not None else hidden, targets, lse, entropy, g, e, grad_hidden,
            grad_weight, grad_bias if grad_bias is not None else grad_weight,
            N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale,
            HAS_BIAS=bias is not None, HAS_ENT_GRAD=grad_entropy is not None, SOFTCAP=capped, UPCAST=upcast,
            PRECISION=precision, GROUP=GROUP_N, **config.launch_options(upcast))
    return (grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype),
            grad_bias.to(bias.dtype) if grad_bias is not None else None)
