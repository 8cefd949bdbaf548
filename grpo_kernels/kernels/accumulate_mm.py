"""C += A^T B with 16-bit A and B and a float32 C, in one GEMM: the GEMM path's dW += dZ^T H across waves where
torch's cuBLAS path cannot do it (backends/wide_gemm.add_mm_wide_ tries torch.addmm with out_dtype and a float32
C once per device; a build without that variant, e.g. some ROCm builds, lands here).

Going through a float32 temporary would cost a [V, H] write and read and a read-modify-write per wave. Here
each program loads its float32 C tile once, accumulates the wave's tokens in registers (tensor cores), and
stores it once: C is read and written exactly once per wave. Programs are grouped along M so the H tiles they
share stay in L2. On the H200 this kernel took 21.3 ms for S1's five later waves, where cuBLAS takes 8-9 ms for
the same products (benchmarks/results/h200-second-run/profile-s1.md): a fallback, not the fast path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import interpreter_compat  # noqa: F401  (runtime-bounded loops under triton 3.6's interpreter)

GPU_BLOCKS = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
_INTERPRETER_BLOCKS = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, GROUP_M=4)


@triton.jit
def _accumulate_at_b_kernel(a_ptr, b_ptr, c_ptr, K, M, N, stride_ak, stride_bk, stride_cm,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_m
    pid_n = (pid % per_group) // group_m

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    acc = tl.load(c_ptrs, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    ks = tl.arange(0, BLOCK_K)
    # pointer tiles built once and advanced by a scalar: recomputing 64-bit offsets per tile costs registers
    a_ptrs = a_ptr + ks[:, None] * stride_ak + rows[None, :]
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :]
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks < K - k0
        a = tl.load(a_ptrs, mask=k_ok[:, None] & row_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:  # the CPU interpreter mis-computes 16-bit dots
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(tl.trans(a), b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptrs, acc, mask=row_ok[:, None] & col_ok[None, :])


def accumulate_at_b(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """c [M, N] float32 (rows contiguous) += a[K, M]^T @ b[K, N] with a, b of one 16-bit dtype (columns
    contiguous; a may have any row stride, e.g. the GEMM path's narrowed dZ). Returns c."""
    K, M = a.shape
    N = b.shape[1]
    if c.dtype != torch.float32 or a.dtype != b.dtype or b.shape[0] != K or tuple(c.shape) != (M, N):
        raise ValueError(f"accumulate_at_b needs c [M, N] float32 and a [K, M], b [K, N] of one dtype; got "
                         f"c {list(c.shape)} {c.dtype}, a {list(a.shape)} {a.dtype}, b {list(b.shape)} {b.dtype}")
    if a.stride(1) != 1 or b.stride(1) != 1 or c.stride(1) != 1:
        raise ValueError("accumulate_at_b needs unit column strides")
    if K == 0:
        return c
    blocks = dict(GPU_BLOCKS if c.is_cuda else _INTERPRETER_BLOCKS)
    grid = (triton.cdiv(M, blocks["BLOCK_M"]) * triton.cdiv(N, blocks["BLOCK_N"]),)
    _accumulate_at_b_kernel[grid](a, b, c, K, M, N, a.stride(0), b.stride(0), c.stride(0), UPCAST=not c.is_cuda,
                                  **blocks)
    return c
