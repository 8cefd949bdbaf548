"""What a run reports at its end, the same whether it has just trained or was finished before (finished_run.py)."""

from __future__ import annotations

import math
from typing import Optional

from ..config import EngineConfig


def reward_windows(rewards: list[float]) -> tuple[list[float], list[float]]:
    """The first and the last few steps' rewards (a quarter of the run, 1 to 10 steps)."""
    window = max(1, min(10, len(rewards) // 4))
    return rewards[:window], rewards[-window:]


def summary_lines(rewards: list[float], eval_before: Optional[dict], eval_after: Optional[dict],
                  config: EngineConfig) -> list[str]:
    lines = []
    if rewards:
        first, last = reward_windows(rewards)
        lines.append(f"reward: {sum(first) / len(first):.3f} (mean of the first {len(first)} steps) -> "
                     f"{sum(last) / len(last):.3f} (mean of the last {len(last)} steps)")
    if eval_after is not None:
        samples = config.run.eval_num_samples
        how = "greedy" if samples == 1 else f"sampled, {samples} per prompt at temperature {config.rollout.temperature}"
        before = "" if eval_before is None else f"{_accuracy(eval_before['accuracy'])} -> "
        lines.append(f"accuracy on the {int(eval_after['num_prompts'])} evaluation prompts ({how}): "
                     f"{before}{_accuracy(eval_after['accuracy'])}")
    return lines


def _accuracy(value: Optional[float]) -> str:
    # NaN in a run, null read back from metrics.jsonl: the first reward function scored no evaluation completion
    if value is None or math.isnan(value):
        return "null (the first reward function scored no completion)"
    return f"{value:.3f}"
