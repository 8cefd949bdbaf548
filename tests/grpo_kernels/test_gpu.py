"""The GEMM path and compiled Triton on a real CUDA GPU at LM-head sizes (skipped without one; `pytest -m gpu`)."""

import pytest
import torch
from grpo_testing import as_float64, assert_output_matches, make_problem, run_loss

from grpo_kernels import (GRPOLossConfig, LogitTransform, fused_linear_grpo_loss, grpo_loss_from_logits,
                          linear_logprobs, reference)
from grpo_kernels import routing
from grpo_kernels.backends import auto_candidates
from grpo_kernels.cost_model import device_key

pytestmark = pytest.mark.gpu


def test_auto_routes_by_this_gpus_name():
    """The name read from the device decides whether the cost model routes: this GPU's (modelled or not, said in
    the reason), against a name the model has no rates for, which takes the default path."""
    spec = routing.device_spec(torch.device("cuda"))
    assert spec.type == "cuda" and spec.name == torch.cuda.get_device_name(0)
    route = routing.route("token", 8192, 4096, 151936, "bfloat16", spec)
    modelled = device_key(spec.name) is not None
    assert ("not modelled" not in route.reason) == modelled, route.reason
    if modelled:
        assert route.backend in auto_candidates() and route.predicted_s > 0
    unknown = routing.route("token", 8192, 4096, 151936, "bfloat16", routing.DeviceSpec("cuda", "Unmodelled GPU"))
    assert "not modelled" in unknown.reason and unknown.predicted_s is None


@pytest.mark.parametrize("transform", [None, LogitTransform(scale=1.2, softcap=5.0)], ids=["plain", "softcapped"])
# triton_tma: the persistent TMA kernels (the token chunks for dapo_kl, the two passes and their dz tiles for
# gspo_entropy), compiled for the GPU itself
@pytest.mark.parametrize("backend", ["gemm", "triton", "triton_tma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("config", [GRPOLossConfig(beta=0.04), GRPOLossConfig(loss_type="grpo", entropy_coef=0.01,
                                                                              importance_sampling_level="sequence")],
                         ids=["dapo_kl", "gspo_entropy"])
def test_lm_head_sized_problem_matches_float64(dtype, config, backend, transform):
    problem = make_problem(seed=0, B=4, T=96, H=256, V=32003, dtype=dtype, device="cuda")
    # a small workspace: several waves, so the 16-bit dW accumulation across waves is exercised
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend, workspace_bytes=100 * 4 * 32003,
                          logit_transform=transform)
    expected = as_float64(problem).to("cuda")
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, expected, config, logit_transform=transform)
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)


@pytest.mark.parametrize("backend", ["gemm", "triton", "triton_tma"])
def test_bitwise_deterministic_on_gpu(backend):
    problem = make_problem(seed=1, B=8, T=128, H=512, V=50257, dtype=torch.bfloat16, device="cuda")
    config = GRPOLossConfig(beta=0.04)
    a_out, a_grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
    b_out, b_grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend)
    assert torch.equal(a_out.loss, b_out.loss)
    for name in a_grads:
        assert torch.equal(a_grads[name], b_grads[name]), name


@pytest.mark.parametrize("backend", ["gemm", "triton"])
def test_peak_memory_far_below_the_logits(backend):
    N, H, V = 4096, 896, 151936
    hidden = torch.randn(1, N, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(V, H, device="cuda", dtype=torch.bfloat16) * 0.03).requires_grad_()
    ids = torch.randint(0, V, (1, N), device="cuda")
    mask = torch.ones(1, N, device="cuda")
    adv = torch.randn(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    workspace = 256 * 2**20
    out = fused_linear_grpo_loss(hidden, weight, ids, mask, adv, backend=backend, workspace_bytes=workspace)
    out.loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    logits_bytes = N * V * 4
    # gradients (dW fp32 accumulator + bf16 copies, dH) are unavoidable; the logits (2.5 GB here) must not
    # appear, only the GEMM path's bounded workspace and its dW temporary
    grads_bytes = V * H * (4 + 2 + 2) + N * H * (4 + 2)
    allowance = workspace + 256 * 2**20 if backend == "gemm" else 64 * 2**20
    assert extra < grads_bytes + allowance, (
        f"peak extra {extra / 2**20:.0f} MiB vs logits {logits_bytes / 2**20:.0f} MiB")


def test_logits_path_and_logprobs_on_gpu():
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 65, 32000, generator=gen)).to("cuda", torch.bfloat16)
    problem = make_problem(seed=2, B=2, T=64, V=32000, device="cuda")
    outs = []
    for bk, x in (("triton", logits.clone()), ("reference", logits.double())):
        x.requires_grad_()
        out = grpo_loss_from_logits(x[:, :-1], problem.completion_ids, problem.completion_mask, problem.advantages,
                                    old_logps=problem.old_logps, backend=bk)
        out.loss.backward()
        outs.append((out.loss.double(), x.grad.double()))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-5)
    err = (outs[0][1] - outs[1][1]).abs().max() / outs[1][1].abs().max()
    assert err < 1.5e-2
    lp = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias)
    lp_ref = reference.linear_logprobs(problem.hidden.double(), problem.weight.double(), problem.completion_ids,
                                       bias=problem.bias.double())
    torch.testing.assert_close(lp.double(), lp_ref, rtol=1e-4, atol=1e-4)


def test_gemm_frozen_head_and_padding_on_gpu():
    """Frozen head: no weight gradient and no dW accumulator; padding rows never reach the head."""
    problem = make_problem(seed=3, B=4, T=64, H=256, V=32000, dtype=torch.bfloat16, device="cuda")
    hidden = problem.hidden.clone().requires_grad_()
    out = fused_linear_grpo_loss(hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                 problem.advantages, old_logps=problem.old_logps, ref_logps=problem.ref_logps,
                                 config=GRPOLossConfig(beta=0.04), backend="gemm")
    out.loss.backward()
    assert problem.weight.grad is None and torch.isfinite(hidden.grad.float()).all()
    assert float(hidden.grad[problem.completion_mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cublas_adds_16_bit_dw_waves_into_float32(dtype):
    """torch >= 2.11's addmm with out_dtype takes the float32 accumulator as C: the GEMM path's fast dW waves
    (the Triton fallback took 2.5x as long on the H200)."""
    from grpo_kernels.backends import wide_gemm

    assert wide_gemm.cublas_adds_into_wide(torch.device("cuda"), dtype)
    storage = torch.randn(300, 2 * 5000, device="cuda").to(dtype)
    dz, h = storage[:, :5000], torch.randn(300, 256, device="cuda").to(dtype)
    acc = torch.randn(5000, 256, device="cuda")
    expected = acc.double() + dz.double().T @ h.double()
    wide_gemm.add_mm_wide_(acc, dz.T, h)
    torch.testing.assert_close(acc.double(), expected, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sequence_level_loss_in_waves_of_whole_sequences_matches_float64(monkeypatch, dtype):
    """The one-pass sequence route on CUDA (sequence_route.py): cuBLAS GEMMs in 16 bits, the Triton row kernels over
    row segments (V 32768: eight of 4096), Q kept in 16 bits, two sequences a wave."""
    from grpo_kernels import sequence_route
    from grpo_kernels.cost_model.paths import SEQUENCE_SCRATCH_ROWS

    taken = []
    run = sequence_route.sequence_level_in_waves
    monkeypatch.setattr(sequence_route, "sequence_level_in_waves",
                        lambda backend, waves, *args: taken.append(waves) or run(backend, waves, *args))
    B, T, V = 6, 96, 32768
    problem = make_problem(seed=2, B=B, T=T, H=256, V=V, dtype=dtype, device="cuda", with_bias=False)
    config = GRPOLossConfig(loss_type="grpo", importance_sampling_level="sequence", beta=0.04)
    workspace = SEQUENCE_SCRATCH_ROWS * V * 4 + 2 * T * V * 2
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend="gemm", workspace_bytes=workspace)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem).to("cuda"), config)
    assert_output_matches(out, grads, ref_out, ref_grads, dtype)
    assert len(taken) == 1 and len(taken[0]) >= B // 2
