import math

import torch

from grpo_engine.steps.advantages import group_advantages, per_function_metrics


def test_group_scaling_matches_the_formula():
    rewards = torch.tensor([[1.0], [0.0], [0.0], [0.0], [2.0], [2.0], [2.0], [2.0]])
    result = group_advantages(rewards, torch.tensor([1.0]), num_generations=4, scale_rewards="group")
    first = torch.tensor([1.0, 0.0, 0.0, 0.0])
    expected = (first - first.mean()) / (first.std() + 1e-4)
    torch.testing.assert_close(result.advantages[:4], expected)
    assert torch.all(result.advantages[4:] == 0)  # no spread, no signal
    assert result.metrics["frac_reward_zero_std"] == 0.5
    assert math.isclose(result.metrics["reward"], 1.125)


def test_batch_and_none_scaling():
    rewards = torch.tensor([[1.0], [3.0], [0.0], [4.0]])
    total = rewards[:, 0]
    centred = total - torch.tensor([2.0, 2.0, 2.0, 2.0])
    batch = group_advantages(rewards, torch.tensor([1.0]), 2, "batch")
    torch.testing.assert_close(batch.advantages, centred / (total.std() + 1e-4))
    none = group_advantages(rewards, torch.tensor([1.0]), 2, "none")
    torch.testing.assert_close(none.advantages, centred)


def test_weights_and_missing_rewards():
    rewards = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    result = group_advantages(rewards, torch.tensor([2.0, 0.5]), 2, "none")
    torch.testing.assert_close(result.total_rewards, torch.tensor([2.0, 0.5], dtype=torch.float64))  # NaN: 0
    metrics = per_function_metrics(rewards, ["a", "b"])
    assert metrics["rewards/a/mean"] == 0.5 and metrics["rewards/b/mean"] == 1.0


def test_all_nan_rewards_give_zero_advantages():
    rewards = torch.full((4, 1), float("nan"))
    result = group_advantages(rewards, torch.tensor([1.0]), 2, "group")
    assert torch.all(result.advantages == 0)


def test_large_rewards_keep_their_spread():
    # in float32 the spread of rewards near 1e20 overflows (1e40), and every advantage of the group became 0
    rewards = torch.tensor([[1e20], [0.0], [3e20], [0.0]])  # float32, as a table of float32 rewards was
    result = group_advantages(rewards, torch.tensor([1.0]), 4, "group")
    total = rewards[:, 0].double()
    expected = (total - total.mean()) / (total.std() + 1e-4)
    assert result.advantages.dtype == torch.float32
    torch.testing.assert_close(result.advantages, expected.float())


def test_rewards_too_large_to_normalise_are_refused():
    import pytest

    rewards = torch.tensor([[1e308], [1e308], [0.0], [1.0]], dtype=torch.float64)  # their group sum overflows
    with pytest.raises(ValueError, match="the rewards are too large to normalise"):
        group_advantages(rewards, torch.tensor([1.0]), 2, "group")
