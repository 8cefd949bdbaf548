"""The persistent TMA forward (kernels/persistent_forward.py) under the interpreter: log-prob, entropy and lse
against the float64 oracle (the interpreter's table entry: 16-token blocks, 32-entry vocabulary tiles, 2 tiles a
split; N 45, V 300: 3 token blocks, 5 splits, both last tiles partial, 15 work items over 3 persistent programs;
H 40 pads to the K block), with and without bias, soft-capped heads, targets outside the shard, float32 and
bfloat16; the exponentials and row maxima it stores for the token-chunk backward; the GRPO epilogue over its statistics; bitwise
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

    def recording(device, items, per_sm=1):
        seen.append((items, original(device, items, per_sm)))
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
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_stored_chunk_holds_each_tiles_exponentials_and_the_rows_running_maxima(dtype, transform):
    """STORE_CHUNK writes, for every [row, column] inside [N, V] once, exp(z - m) in the input dtype, m the row's
    running maximum over its split up to that column's tile (tile_max[row, tile]), and nothing past V (the chunk's
    padding columns keep their bytes); so chunk x exp(m - lse) is the softmax."""
    (hidden, weight, bias), targets, _, _ = inputs(seed=3, N=37, V=203, dtype=dtype)
    block_v = INTERPRETER_CONFIGS["persistent"].block_v
    split = block_v * INTERPRETER_CONFIGS["persistent"].split_tiles
    tiles = -(-203 // block_v)
    chunk = torch.full((37, 208), 7.0, dtype=dtype)
    tile_max = torch.full((37, tiles), 7.0)
    _, _, lse = launch.persistent_forward(*forward_args(hidden, weight, bias, targets, transform),
                                          chunk=chunk[:, :203], tile_max=tile_max)
    z = transform.apply(hidden.double() @ weight.double().T + bias.double()) / TEMPERATURE
    running = torch.stack([z[:, t // (split // block_v) * split:min(203, (t + 1) * block_v)].amax(1)
                           for t in range(tiles)], 1)
    torch.testing.assert_close(tile_max.double(), running, atol=1e-5, rtol=1e-5)
    column_max = running.repeat_interleave(block_v, 1)[:, :203]
    exact = torch.exp(z - column_max)
    # one rounding to the input dtype (the interpreter truncates to bf16 where a GPU rounds to nearest: 2^-7; fp16
    # below its normal range: 2^-25 absolute), after float32 arithmetic on float32 logits
    rounding = {torch.float32: 1e-5, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -11}[dtype]
    assert ((chunk[:, :203].double() - exact).abs() <= rounding * exact + 2 ** -25).all()
    probabilities = chunk[:, :203].double() * torch.exp(column_max - lse.double()[:, None])
    torch.testing.assert_close(probabilities, torch.softmax(z, -1), atol=1e-6, rtol=rounding)
    assert torch.equal(chunk[:, 203:], torch.full((37, 5), 7.0, dtype=dtype))


def test_forward_is_bitwise_reproducible_and_independent_of_the_program_count(monkeypatch):
    (hidden, weight, bias), targets, _, _ = inputs(seed=5, N=40, H=32, V=130, dtype=torch.bfloat16)
    args = forward_args(hidden, weight, bias, targets, SOFTCAPPED)
    first, second = launch.persistent_forward(*args), launch.persistent_forward(*args)
    monkeypatch.setattr(persistent_forward, "programs_for", lambda device, items, per_sm=1: 1)
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
