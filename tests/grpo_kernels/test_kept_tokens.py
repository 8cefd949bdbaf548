"""Kept-token sets: log-probs, entropies and the GRPO loss renormalised over each position's set, on every backend,
padded and packed, against the float64 reference (which masks the materialised logits to the set)."""

import pytest
import torch
from grpo_testing import (FUSED_BACKENDS, as_float64, assert_grad_close, assert_output_matches, device_of, kept_sets,
                          make_problem, registered_backends, run_loss)

from grpo_kernels import (FusedLinearGRPOLoss, GRPOLossConfig, LMHead, LogitTransform, fused_linear_grpo_loss,
                          linear_logprobs, reference)
import grpo_kernels.backends.torch_streaming as torch_chunked
from grpo_kernels.backends.kept_tokens import KeptTokenHead, chunk_rows

CONFIGS = {
    "dapo_kl": dict(beta=0.04),
    "grpo_entropy_bonus": dict(loss_type="grpo", entropy_coef=0.05, temperature=0.7),
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
}


@pytest.mark.parametrize("transform", [None, LogitTransform(scale=0.8, softcap=3.0)], ids=["plain", "softcapped"])
@pytest.mark.parametrize("backend", registered_backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_logprobs_over_kept_sets_match_float64(backend, dtype, transform):
    if backend == "triton" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter upcasts 16-bit dots: bf16 is covered on the GPU")
    problem = make_problem(seed=11, B=2, T=6, H=24, V=90, dtype=dtype, device=device_of(backend))
    kept = kept_sets(problem.completion_ids, 90, 7, seed=1)
    leaves = [x.detach().clone().requires_grad_() for x in (problem.hidden, problem.weight, problem.bias)]
    lp, ent = linear_logprobs(leaves[0], leaves[1], problem.completion_ids, bias=leaves[2], temperature=0.8,
                              return_entropy=True, backend=backend, kept_token_ids=kept, logit_transform=transform)
    weights = torch.linspace(-1, 1, lp.numel(), device=lp.device).view_as(lp)
    ((lp * weights).sum() + 0.3 * ent.sum()).backward()

    p64 = as_float64(problem)
    ref_leaves = [x.clone().requires_grad_() for x in (p64.hidden, p64.weight, p64.bias)]
    ref_lp, ref_ent = reference.linear_logprobs(ref_leaves[0], ref_leaves[1], p64.completion_ids, bias=ref_leaves[2],
                                                temperature=0.8, return_entropy=True, kept_token_ids=kept.cpu(),
                                                logit_transform=transform)
    ((ref_lp * weights.cpu().double()).sum() + 0.3 * ref_ent.sum()).backward()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(lp.detach().cpu().double(), ref_lp.detach(), atol=tol, rtol=tol)
    torch.testing.assert_close(ent.detach().cpu().double(), ref_ent.detach(), atol=tol, rtol=tol)
    for name, leaf, ref_leaf in zip(("hidden", "weight", "bias"), leaves, ref_leaves):
        assert_grad_close(leaf.grad, ref_leaf.grad, dtype, f"d{name}")


def test_a_set_changes_the_result_and_no_set_is_the_whole_vocabulary():
    problem = make_problem(seed=2, B=2, T=5, V=60)
    kept = kept_sets(problem.completion_ids, 60, 5, seed=2, without_set=0.0)
    whole = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias)
    renormalised = linear_logprobs(problem.hidden, problem.weight, problem.completion_ids, bias=problem.bias,
                                   kept_token_ids=kept)
    assert bool((renormalised > whole + 1e-4).all())  # the kept mass is < 1 everywhere
    none = torch.full_like(kept, -1)
    torch.testing.assert_close(linear_logprobs(problem.hidden, problem.weight, problem.completion_ids,
                                               bias=problem.bias, kept_token_ids=none), whole)


def test_a_set_of_one_token_is_certain_and_carries_no_gradient():
    problem = make_problem(seed=3, B=1, T=4, V=40)
    hidden = problem.hidden.clone().requires_grad_()
    kept = problem.completion_ids[..., None]
    lp, ent = linear_logprobs(hidden, problem.weight, problem.completion_ids, kept_token_ids=kept,
                              return_entropy=True)
    assert float(lp.detach().abs().max()) == 0.0 and float(ent.detach().abs().max()) == 0.0
    (lp.sum() + ent.sum()).backward()
    assert float(hidden.grad.abs().max()) == 0.0


@pytest.mark.parametrize("backend", FUSED_BACKENDS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_loss_over_kept_sets_matches_float64(backend, name):
    config = GRPOLossConfig(**CONFIGS[name])
    problem = make_problem(seed=21, B=3, T=5, H=20, V=70, device=device_of(backend))
    kept = kept_sets(problem.completion_ids, 70, 9, seed=3)
    out, grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend, kept_token_ids=kept)
    ref_out, ref_grads = run_loss(reference.fused_linear_grpo_loss, as_float64(problem), config,
                                  kept_token_ids=kept.cpu())
    assert_output_matches(out, grads, ref_out, ref_grads, torch.float32)


@pytest.mark.parametrize("backend", ["gemm", "torch"])
def test_packed_form_equals_padded_form(backend):
    problem = make_problem(seed=5, B=3, T=4, H=16, V=50)
    kept = kept_sets(problem.completion_ids, 50, 6, seed=4)
    config = GRPOLossConfig(beta=0.04)
    padded, padded_grads = run_loss(fused_linear_grpo_loss, problem, config, backend=backend, kept_token_ids=kept)
    B, T, H = problem.hidden.shape
    hidden = problem.hidden.reshape(B * T, H).detach().clone().requires_grad_()
    packed = fused_linear_grpo_loss(hidden, problem.weight, problem.completion_ids.reshape(-1),
                                    problem.completion_mask.reshape(-1), problem.advantages, bias=problem.bias,
                                    old_logps=problem.old_logps.reshape(-1), ref_logps=problem.ref_logps.reshape(-1),
                                    config=config, backend=backend, cu_seqlens=torch.arange(0, B * T + 1, T),
                                    kept_token_ids=kept.reshape(B * T, -1))
    packed.loss.backward()
    torch.testing.assert_close(packed.loss, padded.loss)
    torch.testing.assert_close(packed.logps.view(B, T), padded.logps)
    torch.testing.assert_close(hidden.grad.view(B, T, H), padded_grads["hidden"])


def test_head_chunks_and_frozen_weight():
    """Many small chunks give the same statistics and gradients as one; a frozen head computes no dW."""
    problem = make_problem(seed=6, B=4, T=6, H=12, V=80, dtype=torch.float64)
    hidden, weight, bias = problem.hidden.reshape(-1, 12), problem.weight, problem.bias
    targets = problem.completion_ids.reshape(-1)
    kept = kept_sets(targets, 80, 10, seed=5)
    head = LMHead(weight, bias, 0.9, LogitTransform(scale=1.3, softcap=4.0))
    one, many = KeptTokenHead(torch_chunked, kept), KeptTokenHead(torch_chunked, kept, chunk_elements=10)
    assert chunk_rows(24, 10, 80, 10) == 1
    stats_one, stats_many = one.linear_forward(hidden, head, targets), many.linear_forward(hidden, head, targets)
    for a, b in zip(stats_one, stats_many):
        torch.testing.assert_close(a, b)
    g, e = torch.randn(24, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
    grads_one = one.linear_backward(g, e, hidden, head, targets, stats_one[2], stats_one[1])
    grads_many = many.linear_backward(g, e, hidden, head, targets, stats_one[2], stats_one[1])
    for a, b in zip(grads_one, grads_many):
        torch.testing.assert_close(a, b)
    frozen = one.linear_backward(g, e, hidden, head, targets, stats_one[2], stats_one[1], needs_weight_grad=False)
    assert frozen[1] is None and frozen[2] is None
    torch.testing.assert_close(frozen[0], grads_one[0])


def test_module_takes_kept_sets():
    problem = make_problem(seed=9, B=2, T=5, V=40)
    kept = kept_sets(problem.completion_ids, 40, 4, seed=6)
    module = FusedLinearGRPOLoss(beta=0.0, loss_type="grpo")
    loss, _ = module(problem.hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                     problem.advantages, bias=problem.bias, old_per_token_logps=problem.old_logps,
                     kept_token_ids=kept)
    expected = reference.fused_linear_grpo_loss(
        problem.hidden.double(), problem.weight.double(), problem.completion_ids, problem.completion_mask,
        problem.advantages, bias=problem.bias.double(), old_logps=problem.old_logps,
        config=GRPOLossConfig(loss_type="grpo"), kept_token_ids=kept)
    torch.testing.assert_close(loss.double(), expected.loss, atol=1e-5, rtol=1e-5)


def test_compiled_loss_over_kept_sets_matches_eager():
    problem = make_problem(seed=10, B=2, T=5, H=8, V=30)
    kept = kept_sets(problem.completion_ids, 30, 5, seed=7)
    config = GRPOLossConfig(beta=0.04)

    def step(hidden):
        return fused_linear_grpo_loss(hidden, problem.weight, problem.completion_ids, problem.completion_mask,
                                      problem.advantages, ref_logps=problem.ref_logps, config=config,
                                      backend="gemm", kept_token_ids=kept).loss

    eager_hidden = problem.hidden.clone().requires_grad_()
    eager = step(eager_hidden)
    eager.backward()
    compiled_hidden = problem.hidden.clone().requires_grad_()
    loss = torch.compile(step, backend="aot_eager", fullgraph=True)(compiled_hidden)
    loss.backward()
    torch.testing.assert_close(loss, eager)
    torch.testing.assert_close(compiled_hidden.grad, eager_hidden.grad)


def _errors_for(kept, targets=None, mask=None):
    problem = make_problem(seed=12, B=2, T=3, V=20)
    targets = problem.completion_ids if targets is None else targets
    with pytest.raises((ValueError, TypeError)) as error:
        fused_linear_grpo_loss(problem.hidden, problem.weight, targets, mask if mask is not None else
                               torch.ones(2, 3), problem.advantages, kept_token_ids=kept)
    return str(error.value)


def test_bad_kept_sets_are_named():
    targets = torch.tensor([[1, 2, 3], [4, 5, 6]])
    good = torch.stack([targets, torch.full_like(targets, -1)], dim=-1)
    assert "shape [2, 3] + [K]" in _errors_for(good[..., 0], targets)
    assert "int64" in _errors_for(good.float(), targets)
    too_big = good.clone()
    too_big[0, 0, 1] = 20
    assert "[0, 20) or -1" in _errors_for(too_big, targets)
    missing = good.clone()
    missing[1, 2, 0] = 9
    assert "target token 6 at position [1, 2] is not in its kept_token_ids set" in _errors_for(missing, targets)
    twice = good.clone()
    twice[0, 1, 1] = 2
    assert "twice at position [0, 1]" in _errors_for(twice, targets)
    # a padded position's set is not checked (its target is padding)
    mask = torch.ones(2, 3)
    mask[1, 2] = 0
    problem = make_problem(seed=12, B=2, T=3, V=20)
    fused_linear_grpo_loss(problem.hidden, problem.weight, targets, mask, problem.advantages, kept_token_ids=missing)
