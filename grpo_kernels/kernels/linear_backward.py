"""Backward: recompute each logits tile, turn it into dz with the per-token g = dLoss/dlp and
e = dLoss/dent, and contract it with the LM head (dH) and the hidden states (dW, dbias).

One kernel, `_grad_kernel`, in two orientations, each program the only writer of the output rows it owns, so
the gradients are bitwise reproducible run to run (one writer per element, fixed loop orders):
- dH (OWNS_VOCAB False): a program owns BLOCK_N tokens and sweeps the vocabulary in BLOCK_V tiles;
- dW and dbias (OWNS_VOCAB True): a program owns BLOCK_V vocabulary entries and sweeps the tokens in BLOCK_N
  tiles.
Per streamed tile: one tensor-core GEMM over H recomputes the logits tile [owned, streamed] (the owned block is
the dot's M: 64 on Hopper, so wgmma), the softmax gradient makes dz in registers, and for each BLOCK_K slice of
H a second tensor-core dot forms dz @ operand[streamed, slice] (reduction length: the streamed block), which is
added into the owned float32 output slice by reductions in L2 (`red.global.add.v4.f32`): the program never waits
for the accumulator, where a load-add-store made every slice's dot wait for the accumulator's load.

Cost (bf16 on Hopper, configs.py's sm90 entries: dH 64 tokens x 128 vocab, dW 64 vocab x 128 tokens, BLOCK_K 64;
docs/architecture.md has the table the cost model reads):
- launches: 1 per gradient needed (dH; dW with dbias); programs cdiv(N, 64) for dH, cdiv(V, 64) for dW
- tensor-core work: 2 GEMM-equivalents per gradient (the logits again, then the contraction): 4 for a trained
  head, plus the forward's 1 = 5 (a frozen head: forward + dH = 3)
- L2 <-> SM traffic per gradient: the recompute's 2 N V H (1/own + 1/streamed) bytes, the contraction's operand
  2 N V H / own bytes, and the reductions into the float32 accumulator 4 N V H / streamed bytes
- HBM: each program's accumulator rows [own, H] float32 stay in L2 across its sweep only when the resident
  programs' rows fit (S1 dH: 132 x 64 x 4096 x 4 bytes = 138 MB do not: the reduced lines go to HBM and back)
- extra memory: float32 dH [N, H] and dW [V, H] accumulators (cast to the input dtype at the end)
Why 128 streamed rows, not 256: configs.py (spills).
Deterministic by construction: the reductions are atomic instructions, but no two programs touch one element
and each element is added by the same thread once per streamed tile, in loop order."""

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .tiles import head_transform_args, load_row_stats, logits_tile, softmax_grad_tile


@triton.jit
def _grad_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, out_ptr, grad_bias_ptr,
    N, V, H, stride_hidden, stride_weight, inv_tau, cap_scale,
    OWNS_VOCAB: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[owned rows, :] (float32, row stride H) = sum over the streamed blocks of dz @ operand[streamed, :]."""
    if OWNS_VOCAB:
        own_start = tl.program_id(0) * BLOCK_V
        n_own = V
        own_ptr, stride_own, stream_ptr, stride_stream = weight_ptr, stride_weight, hidden_ptr, stride_hidden
        n_stream = N
        BLOCK_OWN: tl.constexpr = BLOCK_V
        BLOCK_STREAM: tl.constexpr = BLOCK_N
        VOCAB_AXIS: tl.constexpr = 0
        grad_bias = tl.zeros((BLOCK_V,), dtype=tl.float32)
    else:
        own_start = tl.program_id(0) * BLOCK_N
        n_own = N
        own_ptr, stride_own, stream_ptr, stride_stream = hidden_ptr, stride_hidden, weight_ptr, stride_weight
        n_stream = V
        BLOCK_OWN: tl.constexpr = BLOCK_N
        BLOCK_STREAM: tl.constexpr = BLOCK_V
        VOCAB_AXIS: tl.constexpr = 1
    own = own_start + tl.arange(0, BLOCK_OWN)
    own_ok = own < n_own
    if not OWNS_VOCAB:
        targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, own, own_ok, V,
                                                     HAS_ENT_GRAD)
    ks = tl.arange(0, BLOCK_K)
    # 64-bit bases, 32-bit offsets inside the blocks (as tiles.logits_tile)
    out_base = out_ptr + tl.cast(own_start, tl.int64) * H
    out_offsets = tl.arange(0, BLOCK_OWN)[:, None] * H + ks[None, :]
    for s0 in range(0, n_stream, BLOCK_STREAM):
        stream = s0 + tl.arange(0, BLOCK_STREAM)
        stream_ok = stream < n_stream
        z = logits_tile(own_ptr, own_start, n_own, stride_own, stream_ptr, s0, n_stream, stride_stream, bias_ptr, H,
                        inv_tau, cap_scale, HAS_BIAS, SOFTCAP, UPCAST, PRECISION, BLOCK_OWN, BLOCK_STREAM,
                        BLOCK_K, VOCAB_AXIS)
        if OWNS_VOCAB:
            # the streamed tokens' statistics; g and e read 0 past the last token: those rows add nothing
            targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, stream,
                                                         stream_ok, V, HAS_ENT_GRAD)
            # the tile's mask covers the tokens too: a token past N (it reads row s0 again) must add exactly 0
            dz = softmax_grad_tile(z, own[:, None] == targets[None, :], own_ok[:, None] & stream_ok[None, :],
                                   lse[None, :], entropy[None, :], g[None, :], e[None, :], inv_tau, HAS_ENT_GRAD,
                                   cap_scale, SOFTCAP)
            grad_bias += tl.sum(dz, 1)
        else:
            dz = softmax_grad_tile(z, stream[None, :] == targets[:, None], stream_ok[None, :], lse[:, None],
                                   entropy[:, None], g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
        dz = dz.to(stream_ptr.dtype.element_ty)
        if UPCAST:
            dz = dz.to(tl.float32)
        # streamed rows past the end read the block's first row: their dz columns are 0
        stream_rows = tl.where(stream_ok, tl.arange(0, BLOCK_STREAM), 0)
        operand_ptrs = stream_ptr + tl.cast(s0, tl.int64) * stride_stream + (stream_rows[:, None] * stride_stream + ks[None, :])
        for k0 in range(0, H, BLOCK_K):
            operand = tl.load(operand_ptrs)
            if UPCAST:
                operand = operand.to(tl.float32)
            part = tl.dot(dz, operand, input_precision=PRECISION)
            # Added in L2 (a reduction the program does not wait for), not loaded, summed and stored: the
            # accumulator's load fed the dot and stalled every slice. Still deterministic: no other program
            # touches these owned rows, and each element is added by the same thread once per streamed tile, in
            # loop order.
            tl.atomic_add(out_base + k0 + out_offsets, part, mask=own_ok[:, None], sem="relaxed")
            operand_ptrs += BLOCK_K
    if OWNS_VOCAB and HAS_BIAS:
        tl.store(grad_bias_ptr + own, grad_bias, mask=own_ok)


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
        args = (hidden, weight, bias if bias is not None else hidden, targets, lse, entropy, g, e)
        scalars = (N, V, H, hidden.stride(0), weight.stride(0), inv_tau, cap_scale)
        flags = dict(HAS_BIAS=bias is not None, HAS_ENT_GRAD=grad_entropy is not None, SOFTCAP=capped, UPCAST=upcast,
                     PRECISION=precision)
        if needs_hidden_grad:
            _grad_kernel[(triton.cdiv(N, hidden_config.block_n),)](
                *args, grad_hidden, grad_hidden, *scalars, OWNS_VOCAB=False, **flags,
                **hidden_config.launch_options(upcast))
        if needs_weight_grad:
            _grad_kernel[(triton.cdiv(V, weight_config.block_v),)](
                *args, grad_weight, grad_bias if grad_bias is not None else grad_weight, *scalars, OWNS_VOCAB=True,
                **flags, **weight_config.launch_options(upcast))
    return (grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None)
