"""A loss type that divides by max_completion_length (dr_grpo) refuses, in one line naming the mask's row, its
length and the bound, a row that scores more tokens than the bound: TRL generates at most that many, and the
constant would no longer bound the tokens summed (a loss of another scale, no error). Before, such rows were
taken silently. Hypothesis draws the rows' lengths, the padding past them and the bound, in the padded and the
packed layouts; a batch padded past the bound whose rows score no more is taken, and so is every row length
under a loss type that does not read the bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_kernels import GRPOLossConfig, fused_linear_grpo_loss, grpo_loss_from_logits

V, H = 7, 4


@st.composite
def batches(draw):
    bound = draw(st.integers(1, 6))
    lengths = draw(st.lists(st.integers(0, bound + 3), min_size=1, max_size=4))
    T = max(lengths) + draw(st.integers(0, 2)) or 1
    return bound, lengths, T


def padded_mask(lengths: list[int], T: int) -> torch.Tensor:
    return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()


@settings(max_examples=60, deadline=None)
@given(drawn=batches(), loss_type=st.sampled_from(["dr_grpo", "grpo", "dapo"]), packed=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a_row_longer_than_the_fixed_normaliser_is_one_line(drawn, loss_type, packed, seed):
    bound, lengths, T = drawn
    generator = torch.Generator().manual_seed(seed)
    config = GRPOLossConfig(loss_type=loss_type, max_completion_length=bound)
    B = len(lengths)
    advantages = torch.randn(B, generator=generator)
    if packed:  # each sequence as long as its row (at least 1 token), its tokens past the row's length unscored
        sizes = [max(1, n) for n in lengths]
        N = sum(sizes)
        cu = torch.tensor([0] + sizes).cumsum(0).to(torch.int32)
        mask = torch.cat([(torch.arange(s) < n).float() for s, n in zip(sizes, lengths)])
        call = lambda: fused_linear_grpo_loss(  # noqa: E731
            torch.randn(N, H, generator=generator), torch.randn(V, H, generator=generator),
            torch.randint(0, V, (N,), generator=generator), mask, advantages, config=config, backend="torch",
            cu_seqlens=cu)
    else:
        call = lambda: grpo_loss_from_logits(  # noqa: E731
            torch.randn(B, T, V, generator=generator), torch.randint(0, V, (B, T), generator=generator),
            padded_mask(lengths, T), advantages, config=config)
    longest = max(lengths)
    if loss_type == "dr_grpo" and longest > bound:
        with pytest.raises(ValueError) as refused:
            call()
        message = str(refused.value)
        assert "\n" not in message and f"row {lengths.index(longest)} scores {longest} tokens" in message, message
        assert f"max_completion_length={bound}" in message and "dr_grpo" in message, message
    else:
        assert torch.isfinite(call().loss)
