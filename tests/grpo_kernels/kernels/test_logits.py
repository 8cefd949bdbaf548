"""The logits-input Triton kernels (kernels/logits.py) against float64: targets outside the vocabulary (-1, and
past V) get no target logit and no one-hot term."""

import torch
from linear_head_cases import TEMPERATURE, assert_grad, float64_stats, inputs, on_device

from grpo_kernels.kernels import launch


def test_out_of_shard_targets_logits():
    (hidden, weight, bias), targets, g, e = inputs(seed=7, N=24, out_of_shard=6)
    z = hidden.double() @ weight.double().T + bias.double()
    expected_logps, entropy, _, log_p = float64_stats(hidden, weight, bias, targets)
    logits, grid_targets = on_device(z.float().view(2, 12, -1), targets.view(2, 12))
    logps, entropy_, lse = launch.logits_forward(logits, grid_targets, TEMPERATURE)
    torch.testing.assert_close(logps.cpu().double().flatten(), expected_logps, atol=1e-4, rtol=1e-4)
    grad_logits = launch.logits_backward(*on_device(g.float().view(2, 12), e.float().view(2, 12)), logits,
                                         grid_targets, lse, entropy_, TEMPERATURE)
    p = log_p.exp()
    onehot = torch.zeros_like(p)
    inside = (targets >= 0) & (targets < weight.shape[0])
    onehot[inside.nonzero()[:, 0], targets[inside]] = 1.0
    expected = (g[:, None] * (onehot - p) - e[:, None] * p * (log_p + entropy[:, None])) / TEMPERATURE
    assert_grad(grad_logits.reshape(24, -1), expected, torch.float32, "dlogits")
