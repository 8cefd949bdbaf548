"""Inside a caller's torch.autocast region (a trainer's mixed precision) every entry point computes as without it:
the backends built of torch ops ran their matmuls in the autocast dtype (errors of 1e-3 to 1e-1 against float64)
while the kernel backends kept float32, so a result depended on the backend. The backward runs outside the region,
as PyTorch recommends for autocast."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs

# the backends a CPU runs without the Triton interpreter, the float64 oracle among them
BACKENDS = ["reference", "torch", "gemm", "auto"]


def _run(entry: str, backend: str, seed: int, autocast_dtype):
    gen = torch.Generator().manual_seed(seed)
    B, T, H, V = 2, 5, 16, 67
    hidden = torch.randn(B, T, H, generator=gen).requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 0.3).requires_grad_()
    ids = torch.randint(0, V, (B, T), generator=gen)
    mask = (torch.rand(B, T, generator=gen) > 0.2).float()
    advantages = torch.randn(B, generator=gen)
    old = torch.randn(B, T, generator=gen) * 0.1 - 4
    config = GRPOLossConfig(loss_type="grpo", beta=0.04)
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
        if entry == "logprobs":
            out = linear_logprobs(hidden, weight, ids, backend=backend)
        else:
            out = fused_linear_grpo_loss(hidden, weight, ids, mask, advantages, old_logps=old, ref_logps=old,
                                         config=config, backend=backend).loss
    out.sum().backward()
    return out.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("entry", ["loss", "logprobs"])
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), dtype=st.sampled_from([torch.bfloat16, torch.float16]))
def test_autocast_changes_nothing(entry, backend, seed, dtype):
    plain, autocast = _run(entry, backend, seed, None), _run(entry, backend, seed, dtype)
    for name, a, b in zip(("value", "dhidden", "dweight"), plain, autocast):
        assert torch.equal(a, b), f"{entry} on {backend} under autocast {dtype}: {name} differs"
