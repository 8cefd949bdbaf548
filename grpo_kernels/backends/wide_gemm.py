"""GEMMs whose 16-bit operands accumulate and write float32 (float64 for the oracle) without a 16-bit round trip.

Every backend that forms logits with torch GEMMs (gemm, torch, the kept-token sets) takes them from here, so the
choice between tensor cores in the input dtype (CUDA) and a widened GEMM (CPU) is made in one place, and a test
can run the CUDA choice on a CPU (`tensor_core_gemm`).
"""

from __future__ import annotations

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
