"""Rewards of any finite size, under each reward scaling: the advantages are finite float32 values, or one line
naming the rewards and the way out. Before, with rewards.scale_rewards none, rewards past float32's 3.4e38 (a
user's function may return any float64) became infinite advantages silently."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_engine.steps.advantages import group_advantages

REWARDS = st.sampled_from([1e39, -1e39, 3.5e38, 1e300, -1e300, 1e-320, 0.0, -0.0]) | st.floats(
    allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(rewards=st.lists(REWARDS | st.none(), min_size=4, max_size=4), groups=st.sampled_from([1, 2]),
       weight=st.sampled_from([1.0, 2.0, 1e-3]), scale=st.sampled_from(["none", "group", "batch"]))
def test_any_finite_rewards_give_finite_advantages_or_one_line(rewards, groups, weight, scale):
    table = torch.tensor([[float("nan") if r is None else r] for r in rewards] * groups, dtype=torch.float64)
    try:
        result = group_advantages(table, torch.tensor([weight]), num_generations=2, scale_rewards=scale)
    except ValueError as exc:
        message = str(exc)
        assert "\n" not in message and "reward" in message, message
        return
    assert result.advantages.dtype == torch.float32 and torch.isfinite(result.advantages).all(), result.advantages
