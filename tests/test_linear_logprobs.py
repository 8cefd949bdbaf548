"""linear_logprobs: the old/ref log-prob engine, any leading shape, with and without autograd."""

import pytest
import torch
from grpo_testing import FUSED_BACKENDS, with_triton_interpreted

from grpo_kernels import linear_logprobs, reference


@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_matches_log_softmax_and_entropy(backend):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 5, 24, generator=gen)
    weight = torch.randn(70, 24, generator=gen) * 0.6
    bias = torch.randn(70, generator=gen)
    targets = torch.randint(0, 70, (2, 3, 5), generator=gen)
    logps, entropy = linear_logprobs(hidden, weight, targets, bias=bias, temperature=0.8, return_entropy=True,
                                     backend=backend)
    logits = (hidden.double() @ weight.double().T + bias.double()) / 0.8
    log_probs = torch.log_softmax(logits, -1)
    assert logps.shape == targets.shape and logps.dtype == torch.float32
    expected = log_probs.gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(logps.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), -(log_probs.exp() * log_probs).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_no_grad_gives_detached_values(backend):
    hidden = torch.randn(4, 6, 16, requires_grad=True)
    weight = torch.randn(33, 16, requires_grad=True)
    targets = torch.randint(0, 33, (4, 6))
    with torch.no_grad():
        logps = linear_logprobs(hidden, weight, targets, backend=backend)
    assert not logps.requires_grad
    torch.testing.assert_close(logps, reference.linear_logprobs(hidden, weight, targets).detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_gradient_of_logps_and_entropy(backend):
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 7, 20, generator=gen, dtype=torch.float64)
    weight = torch.randn(45, 20, generator=gen, dtype=torch.float64) * 0.5
    targets = torch.randint(0, 45, (3, 7), generator=gen)
    upstream_lp, upstream_ent = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    grads = []
    for bk, dtype in ((backend, torch.float32), ("reference", torch.float64)):
        h, w = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
        lp, ent = linear_logprobs(h, w, targets, return_entropy=True, backend=bk)
        ((lp * upstream_lp.to(lp.dtype)).sum() + (ent * upstream_ent.to(ent.dtype)).sum()).backward()
        grads.append((h.grad.double(), w.grad.double()))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
