"""The backends' CUDA GEMM choice (16-bit operands on tensor cores) run on a CPU against the float64 reference.

On the first GPU run (an H200, docs/benchmarks.md) the torch backend's bf16 log-probs were off by up to 0.04 nats:
on CUDA it formed each logits tile with a bf16-output GEMM, rounding the logits to 8 bits of mantissa before the
softmax, while on a CPU it widened first, so no CPU test saw that branch. Every torch-GEMM backend now takes the
choice from `wide_gemm.tensor_core_gemm`; forcing it on here runs the CUDA branch's data flow on CPU tensors."""

import pytest
import torch
from grpo_testing import LOSS_TOL, as_float64, assert_output_matches, make_problem, run_loss

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, linear_logprobs, reference
from grpo_kernels.backends import wide_gemm

# the gemm backend's CUDA flow has its own CPU test (test_gemm_cuda_flow.py, with its Triton row kernels)
BACKENDS = ["torch"]
SHAPE = dict(B=2, T=48, H=128, V=5000)  # logits of std 3: |z| up to ~12, where a bf16 logit is off by ~0.02


@pytest.fixture
def tensor_cores(monkeypatch):
    monkeypatch.setattr(wide_gemm, "tensor_core_gemm", lambda device: True)


@pytest.fixture(scope="module")
def problem():
    return make_problem(seed=5, dtype=torch.bfloat16, **SHAPE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_and_gradients_match_float64_with_tensor_core_gemms(backend, problem, tensor_cores):
    config = GRPOLossConfig(loss_type="dapo", beta=0.04)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config)
    assert_output_matches(out, grads, ref_out, ref_grads, torch.bfloat16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_grad_logprobs_match_float64_with_tensor_core_gemms(backend, problem, tensor_cores):
    with torch.no_grad():
        logps = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias,
                                backend=backend)
    exact = as_float64(problem)
    expected = reference.linear_logprobs(exact.hidden, exact.weight, exact.completion_ids, bias=exact.bias)
    tol = LOSS_TOL[torch.bfloat16] * 10
    torch.testing.assert_close(logps.double(), expected, atol=tol, rtol=tol)


def test_a_16_bit_logits_tile_would_fail_this_check(problem):
    """The check above can fail: the logits rounded to bf16 before the softmax (the old CUDA branch) are off."""
    exact = as_float64(problem)
    z = torch.nn.functional.linear(problem.hidden.float(), problem.weight.float(), problem.bias.float())
    rounded = torch.log_softmax(z.to(torch.bfloat16).double(), -1).gather(-1, exact.completion_ids[..., None])[..., 0]
    expected = reference.linear_logprobs(exact.hidden, exact.weight, exact.completion_ids, bias=exact.bias)
    assert (rounded - expected).abs().max() > 10 * LOSS_TOL[torch.bfloat16] * 10


# ---- dW waves added into the float32 accumulator: cuBLAS where torch's build can, else the Triton GEMM ------------

def _wave(dtype):
    gen = torch.Generator().manual_seed(31)
    storage = torch.randn(40, 2 * 70, generator=gen).to(dtype)  # dZ narrowed in place: row stride 2V
    dz, h = storage[:, :70], torch.randn(40, 24, generator=gen).to(dtype)
    acc = torch.randn(70, 24, generator=gen)
    return acc, dz, h, acc + dz.double().T.float() @ h.float()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dw_waves_go_through_cublas_where_it_adds_into_float32(monkeypatch, tensor_cores, dtype):
    calls = []

    def addmm(c, a, b, *, out_dtype, out):  # cuBLAS's contract: C read as given, 16-bit products summed in float32
        calls.append((out_dtype, out is c, a.dtype))
        return c.add_(a.float() @ b.float())

    monkeypatch.setattr(wide_gemm, "cublas_adds_into_wide", lambda device, dtype: True)
    monkeypatch.setattr(wide_gemm.torch, "addmm", addmm)
    acc, dz, h, expected = _wave(dtype)
    assert wide_gemm.add_mm_wide_(acc, dz.T, h) is acc
    assert calls == [(torch.float32, True, dtype)]
    torch.testing.assert_close(acc, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dw_waves_fall_back_to_the_triton_gemm_where_cublas_cannot(tensor_cores, dtype):
    from grpo_kernels.backends.gemm import triton_rows

    triton_rows()  # selects the interpreter on CPU
    # a CPU build has no float32-output addmm: the probe says so, as it would on a GPU build without it
    assert not wide_gemm.cublas_adds_into_wide(torch.device("cpu"), dtype)
    acc, dz, h, expected = _wave(dtype)
    assert wide_gemm.add_mm_wide_(acc, dz.T, h) is acc
    torch.testing.assert_close(acc, expected, rtol=1e-5, atol=1e-4)


def test_the_cublas_probe_checks_the_values_not_only_that_the_call_returns(monkeypatch):
    wide_gemm.cublas_adds_into_wide.cache_clear()
    monkeypatch.setattr(wide_gemm.torch, "addmm", lambda c, a, b, *, out_dtype, out: c)  # returns, adds nothing
    try:
        assert not wide_gemm.cublas_adds_into_wide(torch.device("cpu"), torch.bfloat16)
    finally:
        wide_gemm.cublas_adds_into_wide.cache_clear()


def test_the_cublas_probe_accepts_an_addmm_that_adds_exactly(monkeypatch):
    wide_gemm.cublas_adds_into_wide.cache_clear()
    monkeypatch.setattr(wide_gemm.torch, "addmm", lambda c, a, b, *, out_dtype, out: c.add_(a.float() @ b.float()))
    try:
        assert wide_gemm.cublas_adds_into_wide(torch.device("cpu"), torch.bfloat16)
    finally:
        wide_gemm.cublas_adds_into_wide.cache_clear()
