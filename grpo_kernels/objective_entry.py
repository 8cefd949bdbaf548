"""`grpo_objective`, the objective as a caller reaches it: its inputs checked (validation.check_objective_inputs),
then `objective.objective_loss`, which the API's routes call on inputs they have checked already. A module of its
own: the checks import the backends' registry, which imports the objective."""

from __future__ import annotations

from typing import Optional

import torch

from .config import GRPOLossConfig
from .keywords import keywords_checked
from .objective import objective_loss
from .validation import check_objective_inputs, trainer_advantages


@keywords_checked
def grpo_objective(
    logps: torch.Tensor,
    entropy: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    config: Optional[GRPOLossConfig],
    old_logps: Optional[torch.Tensor] = None,
    ref_logps: Optional[torch.Tensor] = None,
    importance_ratio: Optional[torch.Tensor] = None,
    num_items_in_batch: Optional[torch.Tensor | float | int] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar GRPO loss and its metrics from per-token log-probs and entropies.

    logps, entropy: [B, T] float (differentiable). completion_mask: [B, T] in {0, 1}. advantages: [B], [B, 1]
    or [B, T]. old_logps / ref_logps / importance_ratio ([B, T] or [B, 1]): no gradient. num_items_in_batch:
    the dapo/cispo/vespo denominator (active tokens of the whole generation batch divided by the number
    of processes); the local token count when None. Inputs of another shape, type or device are one error
    naming them (validation.check_objective_inputs).
    """
    advantages = trainer_advantages(advantages, logps)  # [B, 1] as [B], integers as float32
    config = check_objective_inputs(logps, entropy, completion_mask, advantages, config, old_logps, ref_logps,
                                    importance_ratio, num_items_in_batch)
    return objective_loss(logps, entropy, completion_mask, advantages, config, old_logps, ref_logps,
                          importance_ratio, num_items_in_batch)
