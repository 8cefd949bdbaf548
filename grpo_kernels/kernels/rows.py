"""Row kernels of the GEMM path: softmax statistics of, and the softmax gradient over, whole rows of a float32
logits workspace that a cuBLAS GEMM has just filled.

One program per row, sweeping the vocabulary in BLOCK_V chunks. The statistics kernel keeps per-lane running
(max, sum exp, sum exp * z) and folds the lanes at the end. The gradient kernel writes dZ over the logits it
reads, in place, narrowed to the GEMM dtype: row i's 16-bit dZ occupies the first half of row i's float32 bytes.

Why no thread can still need the bytes a store overwrites. float32 dZ element k overwrites only logit k, which it
is computed from, so it cannot be stored before that logit is loaded. 16-bit dZ element k overwrites half of logit
floor(k / 2), which another thread may hold. Other programs: a row's program writes only inside its own row.
Inside the program, chunk j's 16-bit stores cover the float32 elements [j, j+1) x BLOCK_V / 2, which belong to
chunks <= j: every warp loaded them at or before its iteration j. But the warps of a program are not in lockstep,
and one warp's stores land on elements another warp loads (already in chunk 0). So each iteration puts a barrier
between its loads and its stores: once any warp is past barrier j, every warp has performed all its loads of
chunks <= j (bar.sync orders memory accesses before it against those after it, for every thread of the program),
and the loads still to come, of chunks > j, lie at or above (j+1) x BLOCK_V, where no store of chunk <= j reaches.
That holds whatever order the warps run in, and with the loads prefetched by a pipeliner (prefetching only moves
loads earlier).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)
from .tiles import raw_logits_grad, transform_logits


@triton.jit
def _row_stats_kernel(z_ptr, stride_z, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, target_z_ptr, V, inv_tau,
                      cap_scale, HAS_BIAS: tl.constexpr, SOFTCAP: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    z_row = z_ptr + row.to(tl.int64) * stride_z
    run_max = tl.full((BLOCK_V,), float("-inf"), dtype=tl.float32)
    sum_exp = tl.zeros((BLOCK_V,), dtype=tl.float32)
    sum_exp_z = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        z = tl.load(z_row + cols, mask=ok, other=0.0)
        if HAS_BIAS:
            z += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        z = tl.where(ok, transform_logits(z, inv_tau, cap_scale, SOFTCAP), float("-inf"))
        new_max = tl.maximum(run_max, z)
        # lanes that have seen only -inf keep sums of 0 (avoids -inf - -inf)
        rescale = tl.where(new_max == float("-inf"), 0.0, tl.exp(run_max - new_max))
        p = tl.where(ok, tl.exp(z - new_max), 0.0)
        sum_exp = sum_exp * rescale + p
        sum_exp_z = sum_exp_z * rescale + p * tl.where(ok, z, 0.0)
        run_max = new_max
    row_max = tl.max(run_max, 0)
    lane_scale = tl.where(run_max == float("-inf"), 0.0, tl.exp(run_max - row_max))
    total = tl.sum(sum_exp * lane_scale, 0)
    lse = row_max + tl.log(total)
    entropy = lse - tl.sum(sum_exp_z * lane_scale, 0) / total

    target = tl.load(targets_ptr + row)
    inside = (target >= 0) & (target < V)
    safe = tl.where(inside, target, 0)
    target_z = tl.load(z_row + safe)
    if HAS_BIAS:
        target_z += tl.load(bias_ptr + safe).to(tl.float32)
    tl.store(lse_ptr + row, lse)
    tl.store(entropy_ptr + row, entropy)
    tl.store(target_z_ptr + row, tl.where(inside, transform_logits(target_z, inv_tau, cap_scale, SOFTCAP), 0.0))


@triton.jit
def _row_grad_kernel(z_ptr, stride_z, dz_ptr, stride_dz, bias_ptr, targets_ptr, lse_ptr, entropy_ptr, g_ptr, e_ptr,
                     V, inv_tau, cap_scale, HAS_BIAS: tl.constexpr, HAS_ENT_GRAD: tl.constexpr, SOFTCAP: tl.constexpr,
                     BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    z_row = z_ptr + row.to(tl.int64) * stride_z
    dz_row = dz_ptr + row.to(tl.int64) * stride_dz
    target = tl.load(targets_ptr + row)
    lse = tl.load(lse_ptr + row)
    g = tl.load(g_ptr + row)
    e = 0.0
    entropy = 0.0
    if HAS_ENT_GRAD:
        e = tl.load(e_ptr + row)
        entropy = tl.load(entropy_ptr + row)
    for v0 in range(0, V, BLOCK_V):  # ascending: the in-place narrowing depends on it
        cols = v0 + tl.arange(0, BLOCK_V)
        ok = cols < V
        z = tl.load(z_row + cols, mask=ok, other=0.0)
        if HAS_BIAS:
            z += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        z = transform_logits(z, inv_tau, cap_scale, SOFTCAP)
        log_p = z - lse
        p = tl.exp(log_p)
        dz = tl.where(cols == target, g, 0.0) - g * p
        if HAS_ENT_GRAD:
            dz -= e * p * (log_p + entropy)
        if dz_ptr.dtype.element_ty != tl.float32:
            tl.debug_barrier()  # narrowing: every warp's loads of this chunk before any warp's stores (docstring)
        tl.store(dz_row + cols, raw_logits_grad(dz, z, inv_tau, cap_scale, SOFTCAP).to(dz_ptr.dtype.element_ty),
                 mask=ok)


# GPU launch options (compiled for sm_90a and sm_80 by benchmarks/model/kernel_report.py: about 30-50 registers, no
# spills): 1024 float32 per program step, 4 warps. The interpreter takes smaller numpy blocks.
GPU_BLOCK_V, GPU_ROW_WARPS = 1024, 4


def _launch_options(V: int, z: torch.Tensor, gpu_launch: Optional[bool]) -> dict:
    """The GPU's options for CUDA tensors (or for any when gpu_launch: tests run them interpreted)."""
    on_gpu = z.is_cuda if gpu_launch is None else gpu_launch
    if on_gpu:
        return dict(BLOCK_V=min(GPU_BLOCK_V, triton.next_power_of_2(V)), num_warps=GPU_ROW_WARPS)
    return dict(BLOCK_V=min(256, triton.next_power_of_2(V)))


def row_stats(z: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor, inv_tau: float,
              cap_scale: Optional[float] = None, gpu_launch: Optional[bool] = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """z [rows, V] float32 raw logits (h W^T) -> (lse, entropy, target logit) of the logits inv_tau * (z + bias),
    soft-capped (inv_tau tanh(cap_scale (z + bias))) when cap_scale is given (tiles.transform_logits), each [rows]."""
    rows, V = z.shape
    lse, entropy, target_z = (torch.empty(rows, dtype=torch.float32, device=z.device) for _ in range(3))
    if rows:
        _row_stats_kernel[(rows,)](z, z.stride(0), bias if bias is not None else z, targets, lse, entropy, target_z,
                                   V, inv_tau, 1.0 if cap_scale is None else cap_scale, HAS_BIAS=bias is not None,
                                   SOFTCAP=cap_scale is not None, **_launch_options(V, z, gpu_launch))
    return lse, entropy, target_z


def row_grad_(z: torch.Tensor, bias: Optional[torch.Tensor], targets: torch.Tensor, lse: torch.Tensor,
              entropy: torch.Tensor, g: torch.Tensor, e: Optional[torch.Tensor], inv_tau: float,
              cap_scale: Optional[float], out_dtype: torch.dtype, gpu_launch: Optional[bool] = None,
              out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Overwrite z [rows, V] (float32, rows contiguous) with dLoss/d(raw logits); returns it as a [rows, V] view of
    z's memory in out_dtype (float32, or 16-bit narrowed in place with row stride 2V). With `out` ([rows, V] in
    out_dtype, rows contiguous, not overlapping z) the gradient goes there instead and z is only read."""
    rows, V = z.shape
    assert z.dtype == torch.float32 and z.stride(1) == 1
    if out is not None:
        assert out.shape == z.shape and out.dtype == out_dtype and out.stride(1) == 1
    dz = out if out is not None else z if out_dtype == torch.float32 else z.view(out_dtype)[:, :V]
    if rows:
        _row_grad_kernel[(rows,)](z, z.stride(0), dz, dz.stride(0), bias if bias is not None else z, targets, lse,
                                  entropy, g, e if e is not None else g, V, inv_tau,
                                  1.0 if cap_scale is None else cap_scale, HAS_BIAS=bias is not None,
                                  HAS_ENT_GRAD=e is not None, SOFTCAP=cap_scale is not None,
                                  **_launch_options(V, z, gpu_launch))
    return dz
