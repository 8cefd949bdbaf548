"""The persistent TMA forward (kernels/persistent_forward.py) under the interpreter: log-prob, entropy and lse
against the float64 oracle (the interpreter's table entry: 16-token blocks, 32-entry vocabulary tiles, 2 tiles a
split; N 45, V 300: 3 token blocks, 5 splits, both last tiles partial, 15 work items over 3 persistent programs;
H 40 pads to the K block), with and without bias, soft-capped heads, targets outside the shard, float32 and
bfloat16; the logits it stores for the token-chunk backward; the GRPO epilogue over its statistics; bitwise
repeatability, also across the number of persistent programs (batch invariance: test_linear_forward.py, for both
forward kernels)."""

import pytest
import torch
from grpo_testing import LOSS_TOL
from linear_head_cases import SOFTCAPPED, TEMPERATURE, float64_stats, forward_args, inputs

from grpo_kernels import GRPOLossConfig
from grpo_kernels.head import IDENTITY
from grpo_kernels.kernels import launch, persistent_forward
from grpo_kernels.kernels.configs import INTERPRETER_CONFIGS
from grpo_kernels.kernels.linear_forward import plan
from grpo_kernels.kernels.token_objective import epilogue_args

pytestmark = pytest.mark.interpreter
TRANSFORMS = pytest.mark.parametrize("transform", [IDENTITY, SOFTCAPPED], ids=["plain", "softcapped"])


def _programs_used(monkeypatch) -> list:
    seen = []
    original = persistent_forward.programs_for

    def recording(device, items):
        seen.append((items, original(device, items)))
        return seen[-1][1]

    monkeypatch.setattr(persistent_forward, "programs_for", recording)
    return seen


@TRANSFORMS
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_matches_float64(dtype, with_bias, transform, monkeypatch):
    (hidden, weight, bias), targets, _, _ = inputs(seed=1, dtype=dtype, with_bias=with_bias, out_of_shard=6)
    shape = plan(45, 300, INTERPRETER_CONFIGS["persistent"])
    assert (shape.token_blocks, shape.splits) == (3, 5)  # what the docstring promises
    programs = _programs_used(monkeypatch)
    logps, entropy, lse = launch.persistent_forward(*forward_args(hidden, weight, bias, targets, transform))
    assert programs == [(15, 3)]  # each program runs five items
    expected = float64_stats(hidden, weight, bias, targets, transform)
    tol = LOSS_TOL[torch.float32] * 10  # float32 statistics of the inputs as rounded to their dtype
    for name, actual, ref in zip(("logps", "entropy", "lse"), (logps, entropy, lse), expected):
        torch.testing.assert_close(actual.double(), ref, atol=tol, rtol=tol, msg=name)


@TRANSFORMS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stored_logits_are_the_transformed_float32_logits(dtype, transform):
    """STORE_LOGITS writes every [row, column] inside [N, V] once, the float32 logits, and nothing past V (the
    chunk's padding columns keep their bytes)."""
    (hidden, weight, bias), targets, _, _ = inputs(seed=3, N=37, V=203, dtype=dtype)
    chunk = torch.full((37, 204), 7.0)
    launch.persistent_forward(*forward_args(hidden, weight, bias, targets, transform), logits=chunk[:, :203])
    z = transform.apply(hidden.double() @ weight.double().T + bias.double()) / TEMPERATURE
    torch.testing.assert_close(chunk[:, :203].double(), z, atol=1e-5, rtol=1e-5)
    assert torch.equal(chunk[:, 203:], torch.full((37, 1), 7.0))


def test_forward_is_bitwise_reproducible_and_independent_of_the_program_count(monkeypatch):
    (hidden, weight, bias), targets, _, _ = inputs(seed=5, N=40, H=32, V=130, dtype=torch.bfloat16)
    args = forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    first, second = launch.persistent_forward(*args), launch.persistent_forward(*args)
    monkeypatch.setattr(persistent_forward, "programs_for", lambda device, items: 1)
    one_program = launch.persistent_forward(*args)
    for a, b, c in zip(first, second, one_program):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_the_triton_backend_takes_the_persistent_kernel_on_hopper(monkeypatch):
    """On Hopper (launch.hopper) the triton backend's forward and its GRPO epilogue run the persistent kernel: the
    same statistics as the 2-D grid's (to float32 rounding; the tiles differ), and the epilogue's per-token outputs
    from them."""
    (hidden, weight, bias), targets, _, _ = inputs(seed=4, N=30, H=32, V=150)
    args = forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    rows = torch.Generator().manual_seed(0)
    adv, old, ref = (torch.randn(30, generator=rows) for _ in range(3))
    per_token = (adv, torch.ones(30), None, old, ref, None, torch.ones(30))
    objective = epilogue_args(GRPOLossConfig(beta=0.04))
    grid = launch.linear_forward(*args), launch.linear_grpo_forward(*args, *per_token, objective)
    programs = _programs_used(monkeypatch)
    monkeypatch.setattr(launch, "hopper", lambda device: True)
    persistent = launch.linear_forward(*args), launch.linear_grpo_forward(*args, *per_token, objective)
    assert len(programs) == 2
    for ours, theirs in zip((*persistent[0], *persistent[1]), (*grid[0], *grid[1])):
        torch.testing.assert_close(ours.double(), theirs.double(), atol=1e-5, rtol=1e-5)
