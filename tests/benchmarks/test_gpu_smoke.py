"""The GPU command's correctness smoke: every backend (and auto) at one mid-size shape against the float64
reference, on the GPU, in well under 2 minutes (`python -m benchmarks.gpu` runs it before anything else)."""

import pytest
import torch
from grpo_testing import LOSS_TOL, as_float64, assert_output_matches, make_problem, run_loss

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, reference

pytestmark = pytest.mark.gpu
# (backend, input dtype): the naive reference backend materialises logits in the input dtype, so it is exact only
# in float32; every fused backend runs bfloat16, as training does
BACKENDS = [("auto", torch.bfloat16), ("gemm", torch.bfloat16), ("triton", torch.bfloat16),
            ("torch", torch.bfloat16), ("reference", torch.float32)]
IDS = [name for name, _ in BACKENDS]
# mid-size: several GEMM-path waves (the workspace below holds 300 rows) and whole vocabulary tiles
SHAPE = dict(B=4, T=256, H=1024, V=32768)
WORKSPACE = 300 * 4 * SHAPE["V"]


_PROBLEMS, _EXPECTED = {}, {}  # per (dtype, device): the inputs, and the float64 results computed once


def problem_in(dtype: torch.dtype, device: str = "cuda"):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if (dtype, device) not in _PROBLEMS:
        _PROBLEMS[dtype, device] = make_problem(seed=0, dtype=dtype, device=device, **SHAPE)
    return _PROBLEMS[dtype, device]


@pytest.mark.parametrize("backend,dtype", BACKENDS, ids=IDS)
def test_loss_and_gradients_match_float64(backend, dtype, device="cuda"):
    problem = problem_in(dtype, device)
    config = GRPOLossConfig(loss_type="dapo", beta=0.04)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend, workspace_bytes=WORKSPACE)
    if ("loss", dtype, device) not in _EXPECTED:
        _EXPECTED["loss", dtype, device] = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    ref_out, ref_grads = _EXPECTED["loss", dtype, device]
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


@pytest.mark.parametrize("backend,dtype", BACKENDS, ids=IDS)
def test_no_grad_logprobs_match_float64(backend, dtype, device="cuda"):
    problem = problem_in(dtype, device)
    with torch.no_grad():
        logps = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias,
                                backend=backend, workspace_bytes=WORKSPACE)
    if ("logprobs", dtype, device) not in _EXPECTED:
        exact = as_float64(problem)
        _EXPECTED["logprobs", dtype, device] = reference.linear_logprobs(exact.hidden, exact.weight,
                                                                         exact.completion_ids, bias=exact.bias)
    expected = _EXPECTED["logprobs", dtype, device]
    tol = LOSS_TOL[dtype] * 10
    torch.testing.assert_close(logps.cpu().double(), expected, atol=tol, rtol=tol)
