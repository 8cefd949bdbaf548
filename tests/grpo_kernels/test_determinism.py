"""Same inputs, same bits, for every backend whose registry entry declares itself deterministic (each output element
has one writer; no order-dependent atomics)."""

import pytest
import torch
from grpo_testing import device_of, make_problem, run_loss, with_triton_interpreted

from grpo_kernels.backends import BACKENDS

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss


@pytest.mark.parametrize("backend", with_triton_interpreted([name for name, spec in BACKENDS.items()
                                                              if spec.deterministic]))
def test_bitwise_identical_runs(backend):
    problem = make_problem(seed=9, B=3, T=9, H=40, V=150, device=device_of(backend))
    config = GRPOLossConfig(beta=0.04, entropy_coef=0.01)
    runs = [run_loss(fused_linear_grpo_loss, problem, config, backend=backend) for _ in range(3)]
    first_out, first_grads = runs[0]
    for out, grads in runs[1:]:
        assert torch.equal(out.loss, first_out.loss)
        for name in first_grads:
            assert torch.equal(grads[name], first_grads[name]), name
