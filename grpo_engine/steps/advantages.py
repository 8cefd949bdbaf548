"""Group-relative advantages (docs/math.md, "Advantages"), computed on every process's rewards.

Rewards are gathered from all processes first: a group of G completions may be split across processes,
and `scale_rewards="batch"` needs the whole batch's spread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdvantageResult:
    advantages: torch.Tensor  # [N] float32, NaN-free
    total_rewards: torch.Tensor  # [N] the weighted reward R
    metrics: dict[str, float]


def group_advantages(rewards_per_func: torch.Tensor, weights: torch.Tensor, num_generations: int,
                     scale_rewards: str) -> AdvantageResult:
    """rewards_per_func: [N, F] with NaN for "no reward"; rows are grouped G at a time in prompt order.

    In float64, so that any finite rewards keep their spread (in float32 a reward of 1e20 squared in the standard
    deviation overflows, and every advantage of its group would quietly be 0); the advantages are float32."""
    n = rewards_per_func.shape[0]
    if n % num_generations:
        raise ValueError(f"{n} rewards do not split into groups of num_generations={num_generations}")
    total = (rewards_per_func.double() * weights.double()[None, :]).nansum(dim=1)  # R = sum_k w_k r_k, None: 0
    grouped = total.view(-1, num_generations)
    group_mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    group_std = grouped.std(dim=1).repeat_interleave(num_generations)  # unbiased, as TRL
    statistics = torch.stack([total, group_mean, group_std, total.std().expand(n)])
    if bool(torch.isinf(statistics).any()):  # NaN only where a group has one member (its std), made 0 below
        raise ValueError("the rewards are too large to normalise: the weighted reward, its group mean or its spread "
                         f"overflows a float64 (largest |weighted reward| {float(total.abs().max()):.3g}); scale "
                         "the rewards or rewards.weights down")
    advantages = total - group_mean
    if scale_rewards == "group":
        advantages = advantages / (group_std + 1e-4)
    elif scale_rewards == "batch":
        advantages = advantages / (total.std() + 1e-4)
    elif scale_rewards != "none":
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")
    advantages = torch.nan_to_num(advantages, nan=0.0)
    largest = float(advantages.abs().max()) if advantages.numel() else 0.0
    if largest > torch.finfo(torch.float32).max:  # only unscaled (scale_rewards none): a scaled one is at most sqrt(G)
        raise ValueError(f"the advantages are too large for float32, the loss's dtype (largest |advantage| "
                         f"{largest:.3g}, with rewards.scale_rewards {scale_rewards}): scale the rewards or "
                         "rewards.weights down, or set rewards.scale_rewards group")
    advantages = advantages.float()

    metrics = {
        "reward": total.mean().item(),
        "reward_std": group_std.mean().item(),  # TRL logs the mean of the per-group std
        "frac_reward_zero_std": (grouped.std(dim=1) < 1e-6).float().mean().item(),
    }
    return AdvantageResult(advantages=advantages, total_rewards=total, metrics=metrics)


def per_function_metrics(rewards_per_func: torch.Tensor, names: list[str]) -> dict[str, float]:
    """rewards/<fn>/mean and std over the samples that function scored (NaN entries skipped)."""
    metrics = {}
    for j, name in enumerate(names):
        column = rewards_per_func[:, j]
        scored = column[~torch.isnan(column)]
        metrics[f"rewards/{name}/mean"] = scored.mean().item() if scored.numel() else float("nan")
        metrics[f"rewards/{name}/std"] = scored.std().item() if scored.numel() > 1 else 0.0
    return metrics
