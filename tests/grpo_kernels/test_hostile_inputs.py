"""Inputs a careless or hostile caller can pass the loss API, on every backend: each gets the right answer or one
clear error naming the argument, never a silent wrong answer or an error from deep inside a kernel."""

from __future__ import annotations

import pytest
import torch

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits, linear_logprobs
from grpo_testing import (FUSED_BACKENDS, as_float64, assert_output_matches, device_of, make_problem,
                          registered_backends, run_loss, with_triton_interpreted)

ALL_BACKENDS = registered_backends()
CONFIG = GRPOLossConfig(beta=0.04)


def _problem(backend: str, seed: int = 0, **kwargs):
    return make_problem(seed, B=2, T=4, H=16, V=40, masked_rows=1, device=device_of(backend), **kwargs)


def _reference(problem, **kwargs):
    return run_loss(fused_linear_grpo_loss, as_float64(problem), CONFIG, backend="reference", **kwargs)


# ---- second-order gradients: refused on every fused backend, exact on the reference --------------------------

@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_a_second_order_gradient_is_refused_naming_the_backend(backend):
    p = _problem(backend)
    hidden = p.hidden.clone().requires_grad_()
    loss = fused_linear_grpo_loss(hidden, p.weight, p.completion_ids, p.completion_mask, p.advantages,
                                  config=CONFIG, backend=backend, **p.loss_kwargs()).loss
    with pytest.raises(RuntimeError, match=f"second-order gradient .* backend='{backend}'"):
        torch.autograd.grad(loss, hidden, create_graph=True)
    logps = linear_logprobs(hidden, p.weight, p.completion_ids, backend=backend)
    with pytest.raises(RuntimeError, match="second-order gradient"):
        torch.autograd.grad(logps.sum(), hidden, create_graph=True)


@pytest.mark.parametrize("backend", with_triton_interpreted(["torch", "triton"]))
def test_a_second_order_gradient_through_given_logits_is_refused(backend):
    p = _problem(backend)
    logits = (p.hidden @ p.weight.T).detach().requires_grad_()
    loss = grpo_loss_from_logits(logits, p.completion_ids, p.completion_mask, p.advantages, backend=backend).loss
    with pytest.raises(RuntimeError, match="second-order gradient"):
        torch.autograd.grad(loss, logits, create_graph=True)


def test_the_reference_backend_differentiates_twice_exactly():
    """A gradient penalty d/dW |dL/dH|^2 on the reference matches the same penalty on explicit float64 logits."""
    p = as_float64(_problem("reference"))

    def penalty_grad(loss_of):
        hidden, weight = p.hidden.clone().requires_grad_(), p.weight.clone().requires_grad_()
        grad_hidden, = torch.autograd.grad(loss_of(hidden, weight), hidden, create_graph=True)
        return torch.autograd.grad(grad_hidden.square().sum(), weight)[0]

    def by_reference(hidden, weight):
        return fused_linear_grpo_loss(hidden, weight, p.completion_ids, p.completion_mask, p.advantages,
                                      config=CONFIG, backend="reference", **{**p.loss_kwargs(), "bias": p.bias}).loss

    def by_logits(hidden, weight):
        logits = hidden @ weight.T + p.bias
        return grpo_loss_from_logits(logits, p.completion_ids, p.completion_mask, p.advantages,
                                     old_logps=p.old_logps, ref_logps=p.ref_logps, config=CONFIG,
                                     backend="reference").loss

    expected = penalty_grad(by_logits)
    assert float(expected.abs().max()) > 0
    torch.testing.assert_close(penalty_grad(by_reference), expected, rtol=1e-10, atol=1e-12)


# ---- backward twice through a kept graph ----------------------------------------------------------------------

@pytest.mark.parametrize("backend", with_triton_interpreted(ALL_BACKENDS))
def test_backward_twice_with_retain_graph_accumulates_twice_the_gradient(backend):
    p = _problem(backend)
    hidden, weight = p.hidden.clone().requires_grad_(), p.weight.clone().requires_grad_()
    loss = fused_linear_grpo_loss(hidden, weight, p.completion_ids, p.completion_mask, p.advantages, config=CONFIG,
                                  backend=backend, **p.loss_kwargs()).loss
    (3.0 * loss).backward(retain_graph=True)
    once = hidden.grad.clone(), weight.grad.clone()
    (3.0 * loss).backward()
    torch.testing.assert_close(hidden.grad, 2 * once[0], rtol=0, atol=0)
    torch.testing.assert_close(weight.grad, 2 * once[1], rtol=0, atol=0)


@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_a_retained_backward_gives_the_same_gradient_as_a_plain_one(backend):
    p = _problem(backend)
    grads = []
    for retain in (False, True):
        weight = p.weight.clone().requires_grad_()
        loss = fused_linear_grpo_loss(p.hidden, weight, p.completion_ids, p.completion_mask, p.advantages,
                                      config=CONFIG, backend=backend, **p.loss_kwargs()).loss
        (0.5 * loss).backward(retain_graph=retain)
        grads.append(weight.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


# ---- values at padded positions are never read ------------------------------------------------------------------

@pytest.mark.parametrize("backend", with_triton_interpreted(ALL_BACKENDS))
@pytest.mark.parametrize("value", [float("inf"), 1e30])
def test_an_infinite_importance_ratio_at_a_padded_position_is_ignored(backend, value):
    p = _problem(backend, importance_ratio="token")
    padded = tuple(torch.nonzero(p.completion_mask == 0)[0].tolist())
    ref_out, ref_grads = _reference(p)
    p.importance_ratio[padded] = value
    out, grads = run_loss(fused_linear_grpo_loss, p, CONFIG, backend=backend)
    assert_output_matches(out, grads, ref_out, ref_grads, p.hidden.dtype)


@pytest.mark.parametrize("backend", with_triton_interpreted(ALL_BACKENDS))
@pytest.mark.parametrize("name", ["importance_ratio", "old_logps", "ref_logps"])
def test_an_infinity_at_a_scored_position_is_refused_naming_it(backend, name):
    p = _problem(backend, importance_ratio="token")
    scored = torch.nonzero(p.completion_mask)[0].tolist()
    getattr(p, name)[tuple(scored)] = float("inf") if name == "importance_ratio" else -float("inf")
    with pytest.raises(ValueError, match=rf"{name} is .*inf at position \{scored}, where completion_mask is 1"):
        run_loss(fused_linear_grpo_loss, p, CONFIG, backend=backend)


# ---- token ids of every integer width, and empty kept sets --------------------------------------------------------

@pytest.mark.parametrize("backend", with_triton_interpreted(ALL_BACKENDS))
@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.int32])
def test_narrow_integer_token_ids_give_the_int64_result(backend, dtype):
    p = _problem(backend)
    expected, expected_grads = run_loss(fused_linear_grpo_loss, p, CONFIG, backend=backend)
    p.completion_ids = p.completion_ids.to(dtype)
    out, grads = run_loss(fused_linear_grpo_loss, p, CONFIG, backend=backend)
    assert float(out.loss.detach()) == float(expected.loss.detach())
    for name in expected_grads:
        torch.testing.assert_close(grads[name], expected_grads[name], rtol=0, atol=0)
    narrow = linear_logprobs(p.hidden, p.weight, p.completion_ids, bias=p.bias, backend=backend)
    wide = linear_logprobs(p.hidden, p.weight, p.completion_ids.long(), bias=p.bias, backend=backend)
    torch.testing.assert_close(narrow, wide, rtol=0, atol=0)
    logits = p.hidden @ p.weight.T
    from_logits = grpo_loss_from_logits(logits, p.completion_ids, p.completion_mask, p.advantages, backend=backend)
    assert float(from_logits.loss) == float(grpo_loss_from_logits(
        logits, p.completion_ids.long(), p.completion_mask, p.advantages, backend=backend).loss)


@pytest.mark.parametrize("backend", with_triton_interpreted(ALL_BACKENDS))
def test_kept_sets_of_zero_ids_are_refused_naming_the_alternative(backend):
    p = _problem(backend)
    empty = torch.empty(*p.completion_ids.shape, 0, dtype=torch.int64, device=p.hidden.device)
    with pytest.raises(ValueError, match=r"kept_token_ids has K=0 ids .* pass kept_token_ids=None"):
        run_loss(fused_linear_grpo_loss, p, CONFIG, backend=backend, kept_token_ids=empty)
    with pytest.raises(ValueError, match="K=0"):
        linear_logprobs(p.hidden, p.weight, p.completion_ids, backend=backend, kept_token_ids=empty)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("temperature", [float("inf"), float("nan"), 0.0, -1.0])
def test_a_temperature_that_is_not_a_finite_positive_number_is_refused(backend, temperature):
    p = _problem("torch")
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        linear_logprobs(p.hidden, p.weight, p.completion_ids, temperature=temperature, backend=backend)
