"""linear_logprobs: the old/ref log-prob engine, any leading shape, with and without autograd."""

import pytest
import torch
from grpo_testing import FUSED_BACKENDS, with_triton_interpreted

from grpo_kernels import LogitTransform, linear_logprobs, reference

# A Cohere-style scale, and Gemma-style soft-caps the logits (std ~2) run into, with and without a scale
TRANSFORMS = {"plain": None, "scaled": LogitTransform(scale=0.4), "softcapped": LogitTransform(softcap=1.5),
              "scaled_softcapped": LogitTransform(scale=2.0, softcap=3.0)}


def _softmax_logits(logits: torch.Tensor, transform, temperature: float) -> torch.Tensor:
    """What the model hands the softmax, written out here: scale, tanh soft-cap, temperature."""
    if transform is not None:
        logits = logits * transform.scale
        if transform.softcap is not None:
            logits = transform.softcap * torch.tanh(logits / transform.softcap)
    return logits / temperature


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_matches_log_softmax_and_entropy(backend, transform):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 3, 5, 24, generator=gen)
    weight = torch.randn(70, 24, generator=gen) * 0.6
    bias = torch.randn(70, generator=gen)
    targets = torch.randint(0, 70, (2, 3, 5), generator=gen)
    logps, entropy = linear_logprobs(hidden, weight, targets, bias=bias, temperature=0.8, return_entropy=True,
                                     backend=backend, logit_transform=TRANSFORMS[transform])
    logits = _softmax_logits(hidden.double() @ weight.double().T + bias.double(), TRANSFORMS[transform], 0.8)
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


@pytest.mark.parametrize("transform", ["plain", "scaled_softcapped"])
@pytest.mark.parametrize("backend", with_triton_interpreted(FUSED_BACKENDS))
def test_gradient_of_logps_and_entropy(backend, transform):
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 7, 20, generator=gen, dtype=torch.float64)
    weight = torch.randn(45, 20, generator=gen, dtype=torch.float64) * 0.5
    targets = torch.randint(0, 45, (3, 7), generator=gen)
    upstream_lp, upstream_ent = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    grads = []
    for bk, dtype in ((backend, torch.float32), ("reference", torch.float64)):
        h, w = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
        lp, ent = linear_logprobs(h, w, targets, return_entropy=True, backend=bk,
                                  logit_transform=TRANSFORMS[transform])
        ((lp * upstream_lp.to(lp.dtype)).sum() + (ent * upstream_ent.to(ent.dtype)).sum()).backward()
        grads.append((h.grad.double(), w.grad.double()))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
