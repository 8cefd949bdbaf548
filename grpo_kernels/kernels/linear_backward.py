"""Backward: recompute each logits tile, turn it into dz with the per-token g = dLoss/dlp and
e = dLoss/dent, and contract it with the LM head (dH) and the hidden states (dW, dbias).

Two kernels, each the only writer of its output rows, so results are bitwise reproducible (no
atomics): dH with a grid over token blocks, dW and dbias with a grid over vocabulary blocks. The price
is one extra logits recompute (five GEMM-equivalents in forward + backward instead of four).

A program's float32 accumulator ([tokens, H] for dH, [vocab, H] for dW) is far too big for the chip,
so it is read and written in global memory once per dz tile it absorbs; what bounds that traffic is the
reduction length of each read-modify-write: the vocabulary width of a dH tile, the token height of a
dW tile. Both kernels therefore contract transposed, tall-skinny tiles: dH^T[k, tokens] +=
W[cols, k]^T @ dz^T[cols, tokens] with a narrow token block (16-64, the tensor-core N dimension) and a
wide vocabulary tile (the reduction), and dW^T[k, cols] += H[rows, k]^T @ dz[rows, cols] with a narrow
vocabulary block and a tall token tile. The register cost of the dz tile is the same as a square tile
of equal area, but each accumulator round trip absorbs 4-16x more of the reduction (configs.py)."""

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .tiles import head_transform_args, load_row_stats, logits_tile, softmax_grad_tile


@triton.jit
def _grad_hidden_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, grad_hidden_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
    HAS_BIAS: tl.constexpr, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok,
                                                 HAS_ENT_GRAD)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        # [BLOCK_V, BLOCK_N]: vocabulary-major
        zt = logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden,
                         stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, True,
                         cap_scale, SOFTCAP)
        dzt = softmax_grad_tile(zt, cols[:, None] == targets[None, :], col_ok[:, None], lse[None, :],
                                entropy[None, :], g[None, :], e[None, :], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            w = tl.load(weight_ptr + cols[:, None] * stride_weight + ks[None, :],
                        mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                w = w.to(tl.float32)
            out = grad_hidden_ptr + rows[None, :] * H + ks[:, None]  # dH^T slice [BLOCK_K, BLOCK_N]
            out_ok = k_ok[:, None] & row_ok[None, :]
            acc = tl.load(out, mask=out_ok, other=0.0)
            acc = tl.dot(tl.trans(w), dzt.to(w.dtype), acc, input_precision=PRECISION)
            tl.store(out, acc, mask=out_ok)


@triton.jit
def _grad_weight_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, grad_weight_ptr,
    grad_bias_ptr, N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
    HAS_BIAS: tl.constexpr, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < V
    grad_bias = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        # g and e read 0 past the last token: those rows add nothing
        targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok,
                                                     HAS_ENT_GRAD)
        z = logits_tile(hidden_ptr, weight_ptr, bias_ptr, rows, cols, row_ok, col_ok, H, stride_hidden,
                        stride_weight, inv_tau, HAS_BIAS, UPCAST, PRECISION, BLOCK_N, BLOCK_V, BLOCK_K, False,
                        cap_scale, SOFTCAP)
        dz = softmax_grad_tile(z, cols[None, :] == targets[:, None], col_ok[None, :], lse[:, None],
                               entropy[:, None], g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
        grad_bias += tl.sum(dz, 0)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            h = tl.load(hidden_ptr + rows[:, None] * stride_hidden + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:
                h = h.to(tl.float32)
            out = grad_weight_ptr + cols[None, :] * H + ks[:, None]  # dW^T slice [BLOCK_K, BLOCK_V]
            out_ok = k_ok[:, None] & col_ok[None, :]
            acc = tl.load(out, mask=out_ok, other=0.0)
            acc = tl.dot(tl.trans(h), dz.to(h.dtype), acc, input_precision=PRECISION)
            tl.store(out, acc, mask=out_ok)
    if HAS_BIAS:
        tl.store(grad_bias_ptr + cols, grad_bias, mask=col_ok)


def linear_backward(grad_logps, grad_entropy, hidden, head, targets, lse, entropy,
                    configs: tuple[KernelConfig, KernelConfig], upcast: bool, precision: str,
                    needs_hidden_grad: bool = True, needs_weight_grad: bool = True):
    """head: a grpo_kernels.head.LMHead; configs: (grad_hidden, grad_weight) table entries. A gradient not
    needed is None, and neither its kernel nor its buffer exists; grad_bias comes with the weight's."""
    N, H = hidden.shape
    weight, bias = head.weight, head.bias
    V = weight.shape[0]
    hidden_config, weight_config = configs
    # float32 accumulators, each element written by exactly one program
    grad_hidden = torch.zeros(N, H, dtype=torch.float32, device=hidden.device) if needs_hidden_grad else None
    grad_weight = torch.zeros(V, H, dtype=torch.float32, device=weight.device) if needs_weight_grad else None
    grad_bias = (torch.zeros(V, dtype=torch.float32, device=weight.device)
                 if needs_weight_grad and bias is not None else None)
    if N > 0 and (needs_hidden_grad or needs_weight_grad):
        g = grad_logps.float().contiguous()
        e = grad_entropy.float().contiguous() if grad_entropy is not None else g
        inv_tau, cap_scale, capped = head_transform_args(head)
        flags = dict(HAS_BIAS=bias is not None, HAS_ENT_GRAD=grad_entropy is not None, SOFTCAP=capped, UPCAST=upcast,
                     PRECISION=precision)
        bias_arg = bias if bias is not None else hidden
        if needs_hidden_grad:
            _grad_hidden_kernel[(triton.cdiv(N, hidden_config.block_n),)](
                hidden, weight, bias_arg, targets, lse, entropy, g, e, grad_hidden,
                N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale,
                **flags, **hidden_config.launch_options(upcast))
        if needs_weight_grad:
            _grad_weight_kernel[(triton.cdiv(V, weight_config.block_v),)](
                hidden, weight, bias_arg, targets, lse, entropy, g, e, grad_weight,
                grad_bias if grad_bias is not None else grad_weight,
                N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale,
                **flags, **weight_config.launch_options(upcast))
    return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None)
