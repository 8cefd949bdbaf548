"""The opt-in one-kernel backward (kernels/tile_backward.py, through launch.linear_backward_tiles) under the
interpreter: dH, dW and dbias against float64 autograd through the head (plain and soft-capped, with and without
the entropy gradient, with and without a bias), tail tiles in both dimensions (N 45, V 300 over the interpreter's
32-token x 64-vocabulary tiles; H 40 pads to the K block), targets outside the shard; one gradient alone goes to
the owner kernel; rows past N add exactly nothing."""

import pytest
import torch
from linear_head_cases import SOFTCAPPED, assert_grad, backward_args, float64_grads, float64_stats, inputs

from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels import launch

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("entropy_grad", [True, False], ids=["entropy_grad", "no_entropy_grad"])
def test_one_kernel_backward_matches_float64(dtype, with_bias, transform, entropy_grad):
    (hidden, weight, bias), targets, g, e = inputs(seed=13, dtype=dtype, with_bias=with_bias, out_of_shard=6)
    if not entropy_grad:
        e = torch.zeros_like(e)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets, transform)
    g_, e_, *rest = backward_args(g, e, hidden, weight, bias, targets, lse, entropy, transform)
    grads = launch.linear_backward_tiles(g_, e_ if entropy_grad else None, *rest)
    expected = float64_grads(hidden, weight, bias, targets, g, e, transform)
    for name, actual, ref in zip(("hidden", "weight", "bias"), grads, expected):
        if name == "bias" and not with_bias:
            assert actual is None
            continue
        assert actual.dtype == dtype
        assert_grad(actual, ref, dtype, f"d{name}")


def test_rows_past_the_end_add_nothing():
    """N = 33 over 32-token tiles: the second token block holds one real row and 31 that read row 32's logits.
    Their gradient must be exactly 0: dW and dbias equal those of the real rows alone, computed with N = 32 + 1
    rows padded by whole zero-gradient rows instead."""
    (hidden, weight, bias), targets, g, e = inputs(seed=21, N=33, H=32, V=130)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets)
    args = backward_args(g, e, hidden, weight, bias, targets, lse, entropy)
    _, grad_weight, grad_bias = launch.linear_backward_tiles(*args)
    # the same rows followed by 31 real rows whose g and e are 0: they add 0 by arithmetic, not by masking
    pad = 31
    hidden2 = torch.cat([hidden, hidden[32:].expand(pad, -1)])
    targets2 = torch.cat([targets, targets[32:].expand(pad)])
    g2, e2 = torch.cat([g, torch.zeros(pad, dtype=g.dtype)]), torch.cat([e, torch.zeros(pad, dtype=e.dtype)])
    lse2, entropy2 = torch.cat([lse, lse[32:].expand(pad)]), torch.cat([entropy, entropy[32:].expand(pad)])
    _, grad_weight2, grad_bias2 = launch.linear_backward_tiles(
        *backward_args(g2, e2, hidden2, weight, bias, targets2, lse2, entropy2))
    assert torch.equal(grad_weight, grad_weight2) and torch.equal(grad_bias, grad_bias2)


@pytest.mark.parametrize("needs", [(True, False), (False, True)], ids=["frozen_head", "frozen_hidden"])
def test_one_gradient_runs_the_owner_kernel(monkeypatch, needs):
    """With one gradient the recompute is shared by nothing: linear_backward's kernel runs (one writer per element,
    bitwise what backend 'triton' gives), and the tile kernel does not."""
    from grpo_kernels.kernels import tile_backward

    def refuse(*args, **kwargs):
        raise AssertionError("the tile kernel ran for one gradient")

    monkeypatch.setattr(tile_backward, "tile_backward", refuse)
    (hidden, weight, bias), targets, g, e = inputs(seed=4, N=20, H=32, V=130)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets)
    args = backward_args(g, e, hidden, weight, bias, targets, lse, entropy)
    needs_hidden, needs_weight = needs
    got = launch.linear_backward_tiles(*args, needs_hidden_grad=needs_hidden, needs_weight_grad=needs_weight)
    owner = launch.linear_backward(*args, needs_hidden_grad=needs_hidden, needs_weight_grad=needs_weight)
    for a, b in zip(got, owner):
        assert (a is None and b is None) or torch.equal(a, b)
