"""The two-pass backward's logits tiles on the Hopper recipe: dLoss/d(raw logits) formed in the tile GEMM's epilogue,
from the statistics the forward already took, and stored once in the GEMM dtype.

The second pass of a two-pass loss (a sequence-level objective, or a token-level one whose workspace is too small for
the token chunks: backends/triton_tma.py) needs, per logit, only its row's lse, entropy, g = dLoss/dlp and
e = dLoss/dent. Where the GEMM path writes the logits of a [rows, columns] tile in float32 by cuBLAS and turns them
into dz in a row pass (4 bytes written, 4 read, 2 written a logit), this kernel computes the tile on tensor cores and
writes dz alone, in the input dtype (2 bytes a logit for bf16): p = exp(z - lse) and log p = z - lse in float32 from
the float32 accumulator, then tiles.softmax_grad_from_p, the formula every backward kernel uses. The dH and dW GEMMs
then read it as they read the GEMM path's tiles (gemm.gradients_from_stats), and the workspace holds twice the rows.

Programs, order, loads: persistent_forward.py's (one program per SM looping over work items in grouped order, hidden
and weight blocks through tensor descriptors, TMA on sm_90a). A work item is one [BLOCK_N, BLOCK_V] output tile of
the [N, columns] slice that starts at head column v0; items are numbered GROUP token blocks x all column tiles, then
the next group, so the resident programs share hidden blocks and each weight tile about once per group.

Determinism: each dz element is written once, by the program of its tile, from its row's statistics and one dot
product whose K order is fixed; which program runs an item changes no arithmetic.

Cost (bf16 on Hopper, the "persistent_dz" table entry, the persistent forward's: 128 x 128 x 64 tiles, 8 warps,
4 stages): 2 N C H tensor-core
work; one exponential a logit; HBM: the weight slice once per group of token blocks, the hidden rows once, N C x the
input's bytes of dz written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)
from .configs import PERSISTENT_GROUP_N, KernelConfig
from .persistent_forward import (set_descriptor_allocator, descriptor_ready, descriptor_tile_dot,
                                 operand_descriptors, programs_for)
from .tiles import head_transform_args, load_row_stats, softmax_grad_from_p, transform_logits


@triton.jit(do_not_specialize=["N", "v0", "columns", "programs"])
def _persistent_dz_kernel(
    hidden_ptr, weight_ptr, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, dz_ptr,
    N, V, H, v0, columns, stride_hidden, stride_weight, stride_dz, inv_tau, cap_scale, programs,
    HAS_BIAS: tl.constexpr, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
):
    hidden_desc, weight_desc = operand_descriptors(hidden_ptr, weight_ptr, N, V, H, stride_hidden, stride_weight,
                                                   BLOCK_N, BLOCK_V, BLOCK_K)
    # the slice's own columns: the store clips rows past N and columns past the slice
    dz_desc = tl.make_tensor_descriptor(dz_ptr, shape=[N, columns], strides=[stride_dz, 1],
                                        block_shape=[BLOCK_N, BLOCK_V])
    blocks = tl.cdiv(N, BLOCK_N)
    column_tiles = tl.cdiv(columns, BLOCK_V)
    for item in range(tl.program_id(0), blocks * column_tiles, programs):
        per_group = GROUP * column_tiles
        first_block = (item // per_group) * GROUP
        group_size = tl.minimum(blocks - first_block, GROUP)
        n0 = (first_block + (item % per_group) % group_size) * BLOCK_N
        c0 = ((item % per_group) // group_size) * BLOCK_V
        rows = n0 + tl.arange(0, BLOCK_N)
        row_ok = rows < N
        targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok,
                                                     V, HAS_ENT_GRAD)
        acc = descriptor_tile_dot(hidden_desc, weight_desc, n0, v0 + c0, H, UPCAST, PRECISION, BLOCK_N, BLOCK_V,
                                  BLOCK_K)
        local = c0 + tl.arange(0, BLOCK_V)
        cols = v0 + local
        # columns past the slice are the next slice's (or past V, zero-filled): computed, never stored
        col_ok = local < columns
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        log_p = transform_logits(acc, inv_tau, cap_scale, SOFTCAP) - lse[:, None]
        p = tl.where(col_ok[None, :], tl.exp(log_p), 0.0)
        is_target = (cols[None, :] == targets[:, None]) & col_ok[None, :]
        dz = softmax_grad_from_p(p, log_p, is_target, col_ok[None, :], lse[:, None], entropy[:, None],
                                 g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
        dz_desc.store([n0, c0], dz.to(dz_ptr.dtype.element_ty))


def persistent_dz(hidden: torch.Tensor, head, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                  g: torch.Tensor, e: torch.Tensor | None, v0: int, out: torch.Tensor, config: KernelConfig,
                  upcast: bool, precision: str) -> torch.Tensor:
    """Write dLoss/d(raw logits) of `hidden`'s rows and head columns [v0, v0 + out.shape[1]) into `out` ([N, columns],
    unit column stride, rows 16-byte aligned; any float dtype) and return it. lse, entropy, g, e: float32 [N] (e None:
    no entropy term). H must be a multiple of config.block_k (launch.padded_to_block_k)."""
    (N, H), V, bias = hidden.shape, head.weight.shape[0], head.bias
    columns = out.shape[1]
    assert out.shape[0] == N and out.stride(1) == 1 and (out.stride(0) * out.element_size()) % 16 == 0
    assert 0 <= v0 and v0 + columns <= V and H % config.block_k == 0
    if N == 0 or columns == 0:
        return out
    inv_tau, cap_scale, capped = head_transform_args(head)
    hidden, weight = descriptor_ready(hidden), descriptor_ready(head.weight)
    items = triton.cdiv(N, config.block_n) * triton.cdiv(columns, config.block_v)
    programs = programs_for(hidden.device, items, config.programs_per_sm)
    g = g.float().contiguous()
    set_descriptor_allocator()
    _persistent_dz_kernel[(programs,)](
        hidden, weight, bias if bias is not None else hidden, targets, lse, entropy, g,
        e.float().contiguous() if e is not None else g, out,
        N, V, H, v0, columns, hidden.stride(0), weight.stride(0), out.stride(0), inv_tau, cap_scale, programs,
        HAS_BIAS=bias is not None, HAS_ENT_GRAD=e is not None, SOFTCAP=capped, UPCAST=upcast, PRECISION=precision,
        GROUP=PERSISTENT_GROUP_N, **config.launch_options(upcast),
    )
    return out
