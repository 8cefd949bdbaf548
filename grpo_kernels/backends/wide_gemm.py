"""GEMMs whose 16-bit operands accumulate and write float32 (float64 for the oracle) without a 16-bit round trip.

Every backend that forms logits with torch GEMMs (gemm, torch, the kept-token sets) takes them from here, so the
choice between tensor cores in the input dtype (CUDA) and a widened GEMM (CPU) is made in one place, and a test
can run the CUDA choice on a CPU (`tensor_core_gemm`).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch


def tensor_core_gemm(device: torch.device) -> bool:
    """Whether GEMMs on `device` run in the 16-bit input dtype (CUDA's tensor cores) rather than widened first
    (a CPU, where a float32 GEMM is both faster and more exact than a 16-bit one)."""
    return device.type == "cuda"


def gemm_dtype(x: torch.Tensor, in_input_dtype: Optional[bool] = None) -> torch.dtype:
    """The dtype GEMM operands are read in: the input dtype on tensor-core devices, float32 elsewhere (float64
    stays float64). in_input_dtype=True takes the tensor-core choice on any device."""
    if in_input_dtype is None:
        in_input_dtype = tensor_core_gemm(x.device)
    if in_input_dtype or x.dtype == torch.float64:
        return x.dtype
    return torch.float32


def mm_wide(a: torch.Tensor, b: torch.Tensor, wide: torch.dtype, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """a @ b with `wide` (float32/64) output. 16-bit operands on CUDA accumulate and write float32 inside cuBLAS
    (torch.mm's out_dtype, torch >= 2.8): logits are never rounded to 16 bits, which would move a log-prob by
    up to |z| * 2^-9 (0.04 nats at |z| = 20)."""
    if a.dtype == wide:
        return torch.mm(a, b, out=out)
    if a.device.type != "cuda":  # no mixed-dtype GEMM on CPU: the same 16-bit values, summed in `wide`
        return torch.mm(a.to(wide), b.to(wide), out=out)
    return torch.mm(a, b, out_dtype=wide, out=out) if out is not None else torch.mm(a, b, out_dtype=wide)


def add_mm_wide_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc (float32/64) += a @ b in one GEMM that reads acc as its C operand: no temporary of acc's size.
    16-bit operands on CUDA go through cuBLAS (torch.addmm's out_dtype with a float32 C, torch >= 2.11) where the
    build supports it, else through the Triton GEMM of kernels/accumulate_mm.py; on a CPU, a float32 GEMM of the
    same 16-bit values. Returns acc."""
    if a.dtype == acc.dtype:
        return acc.addmm_(a, b)
    if not tensor_core_gemm(a.device):
        return acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))
    if cublas_adds_into_wide(a.device, a.dtype):
        return torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    from ..kernels.accumulate_mm import accumulate_at_b

    return accumulate_at_b(acc, a.T, b)


@functools.cache
def cublas_adds_into_wide(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch.addmm adds a product of `dtype` operands into a float32 matrix in place on `device`: tried once
    on small integer-valued operands whose products and sums are exact, so the answer is checked, not assumed
    (a ROCm or other build may lack the float32-output variant, or refuse a C of another dtype)."""
    a = (torch.arange(64 * 32, device=device) % 7 - 3).reshape(32, 64).to(dtype)
    b = (torch.arange(64 * 48, device=device) % 5 - 2).reshape(64, 48).to(dtype)
    acc = torch.arange(32 * 48, device=device, dtype=torch.float32).reshape(32, 48)
    expected = acc + a.float() @ b.float()
    try:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return torch.equal(acc, expected)
