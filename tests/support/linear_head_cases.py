"""Inputs of the Triton linear launchers (kernels/launch.py) and their float64 oracle, computed here from the
logits: log-prob, entropy and lse per token, and the gradients of sum(g lp + e entropy) by float64 autograd through
the head's transform. Targets -1 and >= V stand for ids outside this weight's vocabulary (a vocabulary shard)."""

from __future__ import annotations

import torch
from grpo_testing import GRAD_ATOL, GRAD_TOL, triton_device

from grpo_kernels import LMHead, LogitTransform
from grpo_kernels.head import IDENTITY

TEMPERATURE = 0.7
# A soft-cap the raw logits (std ~3) saturate, after a scale: the transformed kernels' chain rule
SOFTCAPPED = LogitTransform(scale=1.4, softcap=3.0)


def inputs(seed: int, N: int = 45, H: int = 40, V: int = 300, dtype=torch.float32, with_bias: bool = True,
           out_of_shard: int = 0):
    """((hidden, weight, bias), targets, g, e); the first out_of_shard targets lie outside [0, V) (half -1, half
    past V)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * (3.0 / H ** 0.5)
    bias = torch.randn(V, generator=gen, dtype=torch.float64) * 0.5 if with_bias else None
    targets = torch.randint(0, V, (N,), generator=gen)
    targets[:out_of_shard] = -1
    targets[:out_of_shard // 2] = V + 7
    g = torch.randn(N, generator=gen, dtype=torch.float64)
    e = torch.randn(N, generator=gen, dtype=torch.float64) * 0.1
    cast = [x if x is None else x.to(dtype) for x in (hidden, weight, bias)]
    return cast, targets, g, e


def float64_stats(hidden, weight, bias, targets, transform=IDENTITY):
    """(logps, entropy, lse, log_p) in float64 from the inputs as rounded to their dtype."""
    z = transform.apply(hidden.double() @ weight.double().T + (0.0 if bias is None else bias.double())) / TEMPERATURE
    log_p = torch.log_softmax(z, -1)
    lse = torch.logsumexp(z, -1)
    in_shard = (targets >= 0) & (targets < weight.shape[0])
    target_z = torch.where(in_shard, z.gather(1, targets.clamp(0, weight.shape[0] - 1)[:, None])[:, 0], 0.0)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return target_z - lse, entropy, lse, log_p


def float64_grads(hidden, weight, bias, targets, g, e, transform=IDENTITY):
    """(dhidden, dweight, dbias) of sum(g lp + e entropy), by float64 autograd through the transform."""
    leaves = [x.detach().double().requires_grad_() for x in (hidden, weight, bias if bias is not None else
                                                               torch.zeros(weight.shape[0]))]
    logps, entropy, _, _ = float64_stats(*leaves, targets, transform)
    (g * logps + e * entropy).sum().backward()
    return tuple(leaf.grad for leaf in leaves)


def on_device(*tensors):
    device = triton_device()
    return [None if t is None else t.to(device) for t in tensors]


def head(weight, bias, transform=IDENTITY) -> LMHead:
    weight, bias = on_device(weight, bias)
    return LMHead(weight, bias, TEMPERATURE, transform)


def forward_args(hidden, weight, bias, targets, transform=IDENTITY):
    """(hidden, head, targets) of launch.linear_forward, on the Triton device."""
    return on_device(hidden)[0], head(weight, bias, transform), on_device(targets)[0]


def backward_args(g, e, hidden, weight, bias, targets, lse, entropy, transform=IDENTITY):
    """The positional arguments of launch.linear_backward, on the Triton device."""
    g, e, hidden, targets, lse, entropy = on_device(g.float(), e.float(), hidden, targets, lse.float(),
                                                    entropy.float())
    return g, e, hidden, head(weight, bias, transform), targets, lse, entropy


def assert_grad(actual, expected, dtype, what):
    err = float((actual.cpu().double() - expected).abs().max())
    assert err <= GRAD_TOL[dtype] * float(expected.abs().max()) + GRAD_ATOL[dtype], f"{what}: max error {err:.3g}"
