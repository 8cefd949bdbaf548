"""The off-policy correction: the trainer's probability of each sampled token over the sampler's.

A sample drawn by another engine, or by an older policy (rollout.max_staleness >= 1), is weighted in the loss by
the importance ratio exp(trainer - sampler) of the policy before this round's update (the `old` log-probs) over
the sampler's processed log-probs, per token or per sequence (the product over its tokens), capped at
rollout.importance_sampling_cap (truncate) or zeroed past it (mask), as TRL's vLLM importance-sampling
correction. The kernels multiply each token's loss by it (`importance_ratio`).
"""

from __future__ import annotations

from typing import Optional

import torch

MAX_LOG_RATIO = 30.0  # exp() stays finite in float32; any ratio this large is capped or masked anyway


def importance_weights(old_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor, mode: str,
                       cap: float) -> tuple[torch.Tensor, dict[str, float]]:
    """([N, T] weights, metrics of this process's tokens: the raw ratio's mean and max, the corrected ratio's mean,
    the fraction capped or masked)."""
    valid = mask != 0
    log_ratio = torch.where(valid, old_logps.float() - sampler_logps.float(), 0.0)
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    raw = torch.exp(log_ratio.clamp(max=MAX_LOG_RATIO))
    over = raw > cap
    weights = raw.clamp(max=cap) if mode.endswith("truncate") else torch.where(over, 0.0, raw)
    weights = torch.where(valid, weights, 1.0)
    tokens = max(int(valid.sum()), 1)
    metrics = {"off_policy/ratio_mean": raw[valid].sum().item() / tokens,
               "off_policy/ratio_max": raw[valid].max().item() if valid.any() else 1.0,
               "off_policy/corrected_ratio_mean": weights[valid].sum().item() / tokens,
               "off_policy/capped_fraction": over[valid].sum().item() / tokens}
    return weights, metrics


def staleness_metrics(versions: Optional[torch.Tensor], trainer_version: int) -> dict[str, float]:
    """How many optimizer rounds behind the trainer the samples were drawn (0 without versions: on-policy)."""
    if versions is None:
        return {"staleness/mean": 0.0, "staleness/max": 0.0}
    behind = (trainer_version - versions).float()
    return {"staleness/mean": behind.mean().item(), "staleness/max": behind.max().item()}
