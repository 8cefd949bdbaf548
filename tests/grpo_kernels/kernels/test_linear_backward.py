"""The Triton backward (kernels/linear_backward.py) under the interpreter: dH, dW and dbias against float64
autograd through the head (plain and soft-capped, with the entropy gradient), tail tiles in both dimensions (N 45,
V 300 over the interpreter's 32-token x 64-vocabulary blocks; H 40 pads to the K block), targets outside the
shard; bitwise reproducible run to run; gradients not needed are neither computed nor allocated."""

import pytest
import torch
from linear_head_cases import SOFTCAPPED, assert_grad, backward_args, float64_grads, float64_stats, inputs

from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels import launch

TRANSFORMS = pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])


@TRANSFORMS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_backward_matches_float64_and_is_deterministic(dtype, with_bias, transform):
    (hidden, weight, bias), targets, g, e = inputs(seed=3, dtype=dtype, with_bias=with_bias, out_of_shard=4)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets, transform)
    args = backward_args(g, e, hidden, weight, bias, targets, lse, entropy, transform)
    grads = launch.linear_backward(*args)
    expected = float64_grads(hidden, weight, bias, targets, g, e, transform)
    for name, actual, ref in zip(("hidden", "weight", "bias"), grads, expected):
        if name == "bias" and not with_bias:
            assert actual is None
            continue
        assert_grad(actual, ref, dtype, f"d{name}")
    again = launch.linear_backward(*args)
    for first, second in zip(grads, again):
        assert first is None or torch.equal(first, second)


def test_backward_without_the_entropy_gradient():
    (hidden, weight, bias), targets, g, _ = inputs(seed=6, N=20, H=32, V=130)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets)
    g_, _, *rest = backward_args(g, g, hidden, weight, bias, targets, lse, entropy)
    grads = launch.linear_backward(g_, None, *rest)
    expected = float64_grads(hidden, weight, bias, targets, g, torch.zeros_like(g))
    for name, actual, ref in zip(("hidden", "weight", "bias"), grads, expected):
        assert_grad(actual, ref, torch.float32, f"d{name}")


@pytest.mark.parametrize("needs", [(True, False), (False, True), (False, False)], ids=["frozen_head", "frozen_hidden",
                                                                                         "neither"])
def test_backward_skips_gradients_not_needed(monkeypatch, needs):
    from grpo_kernels.kernels import linear_backward as module

    sizes = []

    class RecordingTorch:
        """The launcher module's `torch`, recording the shape of every zeros() buffer."""

        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def zeros(*shape, **kwargs):
            out = torch.zeros(*shape, **kwargs)
            sizes.append(tuple(out.shape))
            return out

    monkeypatch.setattr(module, "torch", RecordingTorch())
    (hidden, weight, bias), targets, g, e = inputs(seed=4, N=20, H=32, V=130)
    _, entropy, lse, _ = float64_stats(hidden, weight, bias, targets)
    args = backward_args(g, e, hidden, weight, bias, targets, lse, entropy)
    needs_hidden, needs_weight = needs
    grad_hidden, grad_weight, grad_bias = launch.linear_backward(
        *args, needs_hidden_grad=needs_hidden, needs_weight_grad=needs_weight)
    expected = float64_grads(hidden, weight, bias, targets, g, e)
    assert (grad_hidden is not None) == needs_hidden
    assert (grad_weight is not None) == needs_weight and (grad_bias is not None) == needs_weight
    assert (tuple(weight.shape) in sizes) == needs_weight, f"buffers allocated: {sizes}"
    assert (tuple(hidden.shape) in sizes) == needs_hidden, f"buffers allocated: {sizes}"
    if needs_hidden:
        assert_grad(grad_hidden, expected[0], torch.float32, "dhidden")
    if needs_weight:
        assert_grad(grad_weight, expected[1], torch.float32, "dweight")
