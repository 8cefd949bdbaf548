"""The token-chunk backward's row step: a chunk as persistent_forward.py's STORE_CHUNK wrote it (each tile's
p = exp(z - m) in the input dtype, m per row and tile in float32) turned into dLoss/d(raw logits) in place, from
per-token lse, entropy, g = dLoss/dlp and e = dLoss/dent. The chunk's dH = dz W and dW += dz^T h are then
GEMMs (backends/triton_tma.py).

A program owns one [BLOCK_N, BLOCK_V] tile, BLOCK_V the forward's vocabulary tile, so one m a row:
- the probabilities are p exp(m - lse) and their logs log p + m - lse, in float32; an exponential that underflowed
  in the input dtype is a probability 0 (its log never read);
- a stored exponential is off by its rounding to the input dtype (2^-9 relative for bf16), the size of dz's own
  rounding, and its log by as much absolute; the target's 1 - p, where p near 1 would lose its digits, does not
  suffer: p > 1/2 only for the row's largest logit, which is its tile's running maximum m, so its stored
  exponential is exp(0) = 1 exactly and p = exp(m - lse) carries float32's digits;
- the rest is tiles.softmax_grad_from_p, the formula every backward kernel uses.

In place: element [r, k] of dz overwrites element [r, k] of the chunk, the only thing computed from it, in the same
program; no other program reads that tile, and the forward that wrote the chunk has finished (same stream) before
this launch starts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)
from .configs import KernelConfig
from .tiles import head_transform_args, load_row_stats, softmax_grad_from_p


@triton.jit
def _chunk_grad_kernel(
    chunk_ptr, tile_max_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, N, V, stride_chunk,
    stride_tile_max, tiles, inv_tau, cap_scale, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
):
    # consecutive programs take consecutive tiles of a row block: neighbouring memory
    pid = tl.program_id(0)
    rows = (pid // tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = pid % tiles
    row_ok = rows < N
    targets, lse, entropy, g, e = load_row_stats(targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr, rows, row_ok, V,
                                                 HAS_ENT_GRAD)
    shift = tl.load(tile_max_ptr + rows.to(tl.int64) * stride_tile_max + tile, mask=row_ok, other=0.0) - lse
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < V
    ok = row_ok[:, None] & col_ok[None, :]
    at = chunk_ptr + rows.to(tl.int64)[:, None] * stride_chunk + cols[None, :]
    stored = tl.load(at, mask=ok, other=0.0).to(tl.float32)
    p = stored * tl.exp(shift)[:, None]
    log_p = tl.log(tl.where(stored > 0, stored, 1.0)) + shift[:, None]
    dz = softmax_grad_from_p(p, log_p, cols[None, :] == targets[:, None], col_ok[None, :], lse[:, None],
                             entropy[:, None], g[:, None], e[:, None], inv_tau, HAS_ENT_GRAD, cap_scale, SOFTCAP)
    tl.store(at, dz.to(chunk_ptr.dtype.element_ty), mask=ok)


def chunk_grad_(chunk: torch.Tensor, tile_max: torch.Tensor, head, targets: torch.Tensor, lse: torch.Tensor,
                entropy: torch.Tensor, g: torch.Tensor, e: torch.Tensor | None,
                config: KernelConfig, interpreted: bool) -> torch.Tensor:
    """Overwrite chunk [rows, V] (STORE_CHUNK's exponentials of `head`'s logits, unit column stride; tile_max its
    [rows, cdiv(V, config.block_v)] maxima) with dLoss/d(raw logits) in the chunk's dtype; returns the chunk.
    lse, entropy: float32 [rows]."""
    N, V = chunk.shape
    if N == 0:
        return chunk
    tiles = triton.cdiv(V, config.block_v)
    assert chunk.stride(1) == 1 and tile_max.stride(1) == 1 and tile_max.shape == (N, tiles)
    inv_tau, cap_scale, capped = head_transform_args(head)
    g = g.float().contiguous()
    _chunk_grad_kernel[(triton.cdiv(N, config.block_n) * tiles,)](
        chunk, tile_max, targets, lse, entropy, g, e.float().contiguous() if e is not None else g, N, V,
        chunk.stride(0), tile_max.stride(0), tiles, inv_tau, cap_scale, HAS_ENT_GRAD=e is not None, SOFTCAP=capped,
        **config.launch_options(interpreted))
    return chunk
