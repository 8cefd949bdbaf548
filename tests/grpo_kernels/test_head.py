"""LMHead and LogitTransform: the constants the backends get, the transform as the models write it, and the edge
TRL keeps (a logit scale of 0)."""

import math

import pytest
import torch
from grpo_testing import device_of, registered_backends

from grpo_kernels import LMHead, LogitTransform, linear_logprobs


def test_logit_constants_fold_the_scale_and_move_the_cap():
    weight = torch.zeros(3, 2)
    capped = LMHead(weight, temperature=0.5, transform=LogitTransform(scale=2.0, softcap=30.0))
    assert capped.logit_constants == (60.0, 2.0 / 30.0)  # softcap / tau, scale / softcap
    scaled = LMHead(weight, temperature=0.5, transform=LogitTransform(scale=2.0))
    assert scaled.logit_constants == (4.0, None)  # scale / tau: a temperature
    assert LMHead(weight).logit_constants == (1.0, None) and LMHead(weight).transform.is_identity


def test_apply_is_the_models_formula():
    logits = torch.linspace(-100.0, 100.0, 41, dtype=torch.float64)
    transform = LogitTransform(scale=0.5, softcap=30.0)
    # Gemma 2: logits / cap, tanh, * cap (after Cohere-style scaling)
    torch.testing.assert_close(transform.apply(logits), 30.0 * torch.tanh(0.5 * logits / 30.0))
    # the constants give the same logits
    inv_tau, cap_scale = LMHead(torch.zeros(1, 1), transform=transform).logit_constants
    torch.testing.assert_close(inv_tau * torch.tanh(cap_scale * logits), transform.apply(logits))


@pytest.mark.parametrize("backend", registered_backends())
def test_zero_scale_gives_a_uniform_softmax(backend):
    """A logit_scale of 0 (TRL keeps it) makes every logit 0, soft-capped or not: uniform, and no gradient."""
    gen = torch.Generator().manual_seed(0)
    V = 11
    hidden = torch.randn(4, 6, generator=gen).to(device_of(backend)).requires_grad_()
    weight = torch.randn(V, 6, generator=gen).to(device_of(backend)).requires_grad_()
    targets = torch.randint(0, V, (4,), generator=gen).to(device_of(backend))
    for transform in (LogitTransform(scale=0.0), LogitTransform(scale=0.0, softcap=30.0)):
        logps, entropy = linear_logprobs(hidden, weight, targets, backend=backend, logit_transform=transform,
                                         return_entropy=True)
        torch.testing.assert_close(logps.detach().cpu(), torch.full((4,), -math.log(V)))
        torch.testing.assert_close(entropy.detach().cpu(), torch.full((4,), math.log(V)))
        (logps.sum() + entropy.sum()).backward()
        assert float(hidden.grad.abs().max()) == 0.0 and float(weight.grad.abs().max()) == 0.0
        hidden.grad = weight.grad = None
