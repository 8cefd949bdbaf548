"""The token-chunk backward's row step: a chunk of float32 transformed logits, as persistent_forward.py's
STORE_LOGITS wrote them, turned into dLoss/d(raw logits) in the input dtype, in place, from per-token lse, entropy,
g = dLoss/dlp and e = dLoss/dent. The chunk's dH = dz W and dW += dz^T h are then GEMMs (backends/triton_tma.py).

A program owns BLOCK_N whole rows and sweeps them in BLOCK_V column tiles, in ascending order. Why no thread can
still need the bytes a store overwrites (rows.py's argument, for 2-D tiles):
- other programs: a program reads and writes only its own rows, and the forward kernel that wrote the chunk has
  finished (same stream) before this one starts;
- float32 dz (float32 inputs): element [r, k] overwrites only logit [r, k], which it is computed from;
- 16-bit dz: row r's element k lands in the first half of row r's float32 bytes, on float32 element floor(k / 2).
  Tile j's stores cover float32 columns [j, j + 1) x BLOCK_V / 2 of the program's rows, all loaded by tiles <= j,
  and the loads still to come (tiles > j) start at (j + 1) x BLOCK_V, where no store of a tile <= j reaches. The
  warps of a program are not in lockstep, so each tile puts a barrier between its loads and its stores: once any
  warp is past barrier j, every warp has made its loads of tiles <= j (a prefetching pipeliner only moves loads
  earlier).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)
from .configs import KernelConfig
from .tiles import head_transform_args, load_row_stats, softmax_grad_tile


@triton.jit
def _logits_grad_kernel(
    chunk_ptr, dz_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, N, V, stride_chunk, stride_dz, inv_tau,
    cap_scale, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok, V,
                                                 HAS_ENT_GRAD)
    chunk_rows = chunk_ptr + rows.to(tl.int64)[:, None] * stride_chunk
    dz_rows = dz_ptr + rows.to(tl.int64)[:, None] * stride_dz
    for v0 in range(0, V, BLOCK_V):  # ascending: the in-place narrowing depends on it (module docstring)
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        ok = row_ok[:, None] & col_ok[None, :]
        z = tl.load(chunk_rows + cols[None, :], mask=ok, other=0.0)
        dz = softmax_grad_tile(z, cols[None, :] == targets[:, None], col_ok[None, :], lse[:, None], entropy[:, None],
                               g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
        if dz_ptr.dtype.element_ty != tl.float32:
            tl.debug_barrier()  # narrowing: every warp's loads of this tile before any warp's stores
        tl.store(dz_rows + cols[None, :], dz.to(dz_ptr.dtype.element_ty), mask=ok)


def logits_grad_(logits: torch.Tensor, head, targets: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                 g: torch.Tensor, e: torch.Tensor | None, out_dtype: torch.dtype, config: KernelConfig,
                 interpreted: bool) -> torch.Tensor:
    """Overwrite logits [rows, V] (float32 transformed logits of `head`, unit column stride) with dLoss/d(raw
    logits); returns it as a [rows, V] view of the same memory in out_dtype (a 16-bit row stride is twice the
    float32 one)."""
    N, V = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    dz = logits if out_dtype == torch.float32 else logits.view(out_dtype)[:, :V]
    if N == 0:
        return dz
    inv_tau, cap_scale, capped = head_transform_args(head)
    g = g.float().contiguous()
    _logits_grad_kernel[(triton.cdiv(N, config.block_n),)](
        logits, dz, targets, lse, entropy, g, e.float().contiguous() if e is not None else g, N, V,
        logits.stride(0), dz.stride(0), inv_tau, cap_scale, HAS_ENT_GRAD=e is not None, SOFTCAP=capped,
        **config.launch_options(interpreted))
    return dz
