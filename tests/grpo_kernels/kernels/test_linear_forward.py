"""The Triton forward (kernels/linear_forward.py) under the interpreter: log-prob, entropy and lse against the
float64 oracle at shapes with several vocabulary splits and tail tiles in both dimensions (the interpreter's table
entry: 16-token blocks, 32-entry vocabulary tiles, 2 tiles a split; N 45, V 300: 3 token blocks, 5 splits, both
last tiles partial; H 40 pads to the K block), soft-capped heads and targets outside the shard; the token-level
objective's epilogue against the spec; batch invariance, bitwise; and the GPU launch plan as a function of the
shape."""

import pytest
import torch
from grpo_testing import LOSS_TOL
from hypothesis import example, given, settings
from hypothesis import strategies as st
from linear_head_cases import SOFTCAPPED, float64_stats, forward_args, inputs, on_device

from grpo_kernels import GRPOLossConfig
from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels import launch
from grpo_kernels.kernels import linear_forward as family
from grpo_kernels.kernels.configs import GPU_CONFIGS, INTERPRETER_CONFIGS, SIXTEEN_BIT
from grpo_kernels.kernels.token_objective import epilogue_args

TRANSFORMS = pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])


@TRANSFORMS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_float64(dtype, transform):
    (hidden, weight, bias), targets, _, _ = inputs(seed=1, dtype=dtype, out_of_shard=6)
    shape = family.plan(45, 300, INTERPRETER_CONFIGS["forward"])
    assert shape.splits == 5 and shape.token_blocks == 3  # what the docstring promises this test exercises
    logps, entropy, lse = launch.linear_forward(*forward_args(hidden, weight, bias, targets, transform))
    expected = float64_stats(hidden, weight, bias, targets, transform)
    tol = LOSS_TOL[torch.float32] * 10  # float32 statistics of the inputs as rounded to their dtype
    for name, actual, ref in zip(("logps", "entropy", "lse"), (logps, entropy, lse), expected):
        torch.testing.assert_close(actual.cpu().double(), ref, atol=tol, rtol=tol, msg=name)


def test_forward_is_bitwise_reproducible():
    (hidden, weight, bias), targets, _, _ = inputs(seed=5, N=20, H=32, V=130)
    args = forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    first, second = launch.linear_forward(*args), launch.linear_forward(*args)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("forward", [launch.linear_forward, launch.persistent_forward],
                         ids=["2d_grid", "persistent_tma"])
def test_a_row_is_bitwise_the_same_in_any_batch(forward):
    """Batch invariance: one row alone, and in batches of several sizes at several positions (first, inside a
    token block, at a block's end, last), gives bitwise the same log-prob and entropy; for both forward kernels
    (the persistent one: kernels/persistent_forward.py)."""
    (hidden, weight, bias), targets, _, _ = inputs(seed=9, N=40, H=32, V=100, dtype=torch.bfloat16)
    hidden_d, head, targets_d = forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    row = 3
    alone_logp, alone_entropy, _ = forward(hidden_d[row:row + 1], head, targets_d[row:row + 1])
    for size, position in ((2, 1), (17, 15), (40, 16), (40, 39)):
        others = [i for i in range(40) if i != row][:size - 1]
        order = others[:position] + [row] + others[position:]
        logps, entropy, _ = forward(hidden_d[order], head, targets_d[order])
        assert torch.equal(logps[position:position + 1], alone_logp), (size, position)
        assert torch.equal(entropy[position:position + 1], alone_entropy), (size, position)


def test_launch_plan_is_the_one_launched(monkeypatch):
    """The launcher runs plan()'s programs: cdiv(N, block_n) token blocks x splits."""
    launched = []
    kernel = family._partial_stats_kernel

    class Recording:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]

    monkeypatch.setattr(family, "_partial_stats_kernel", Recording())
    (hidden, weight, bias), targets, _, _ = inputs(seed=2, N=33, H=32, V=100)
    launch.linear_forward(*forward_args(hidden, weight, bias, targets))
    shape = launch.forward_plan(33, 100, torch.float32, hidden.device)
    assert launched == [(shape.programs,)] and shape.programs == 3 * 2


@settings(max_examples=200, deadline=None)
@given(N=st.integers(1, 1 << 20), M=st.integers(1, 1 << 20), V=st.integers(1, 1 << 18),
       arch=st.sampled_from(["sm90", "sm80"]))
@example(N=8192, M=1, V=151936, arch="sm90")  # the benchmark shapes S1..S3, checked every run
@example(N=65536, M=16384, V=248320, arch="sm90")
@example(N=65536, M=8192, V=151936, arch="sm80")
def test_gpu_plan_splits_depend_on_the_vocabulary_only(N, M, V, arch):
    config = GPU_CONFIGS[arch]["forward"][SIXTEEN_BIT]
    plan_n, plan_m = family.plan(N, V, config), family.plan(M, V, config)
    assert (plan_n.split_width, plan_n.splits) == (plan_m.split_width, plan_m.splits)
    width = plan_n.split_width
    assert width % config.block_v == 0 and width <= config.split_tiles * config.block_v
    assert (plan_n.splits - 1) * width < V <= plan_n.splits * width  # no split empty
    assert plan_n.token_blocks == -(-N // config.block_n)


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "sapo"])
def test_objective_epilogue_matches_the_spec(loss_type):
    """The fused forward's per-token terms and g = dterm/dlp against grpo_kernels.objective's token_level_step
    evaluated on the float64 log-probs (every optional input given)."""
    from grpo_kernels.objective import TokenInputs, token_level_step

    (hidden, weight, bias), targets, _, _ = inputs(seed=4, N=37, H=32, V=150)
    N = hidden.shape[0]
    gen = torch.Generator().manual_seed(11)
    advantages = torch.randn(N, generator=gen)
    old, ref = (torch.randn(N, generator=gen) * 0.1 - 5.0 for _ in range(2))
    rho = torch.rand(N, generator=gen) + 0.5
    mask = (torch.rand(N, generator=gen) > 0.2).float()
    weights = mask / mask.sum()
    config = GRPOLossConfig(loss_type=loss_type, beta=0.04, entropy_coef=0.01)
    terms, logps, entropy, lse, grad, kl, clip = launch.linear_grpo_forward(
        *forward_args(hidden, weight, bias, targets), *on_device(advantages, weights, weights * 0.01, old, ref, rho,
                                                                  mask), epilogue_args(config))
    expected_logps, expected_entropy, _, _ = float64_stats(hidden, weight, bias, targets)
    torch.testing.assert_close(logps.cpu().double(), expected_logps, atol=1e-4, rtol=1e-4)
    step = token_level_step(logps.cpu(), entropy.cpu(),
                            TokenInputs(mask, advantages, weights, weights * 0.01, old, ref, rho), config)
    torch.testing.assert_close(terms.cpu(), step.terms.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.cpu(), step.grad_logps.float(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(kl.cpu(), step.kl.float(), atol=1e-6, rtol=1e-5)
    assert torch.equal(clip.cpu(), step.clip.to(clip.dtype))
