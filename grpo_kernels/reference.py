"""The eager PyTorch path: materializes the logits, fp32 log_softmax, gather, objective.

It is the baseline the benchmarks measure against and, run in float64, the oracle the tests check every
fused path against. Signatures match the public API in `grpo_kernels.api`.
"""

from __future__ import annotations

from typing import Optional

import torch

from .backends.protocol import stats_dtype
from .config import GRPOLossConfig
from .head import IDENTITY, LMHead, LogitTransform
from .objective import GRPOLossOutput, grpo_loss_output
from .validation import (check_config, check_kept_token_ids, check_linear_inputs, check_logit_transform,
                         check_logits, check_loss_inputs, check_targets, ids_where_scored, trainer_advantages)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                         transform: LogitTransform = IDENTITY, kept_token_ids: Optional[torch.Tensor] = None
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob of `targets` and entropy under softmax(transform(logits) / temperature), in float32
    (float64 stays float64). With kept_token_ids [..., K] (-1 padding), a position that carries a set is
    renormalised over it: the other logits are -inf."""
    scaled = transform.apply(logits.to(stats_dtype(logits.dtype))) / temperature
    if kept_token_ids is None:
        log_probs = torch.log_softmax(scaled, dim=-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
    else:
        V = scaled.shape[-1]
        # padding (-1) goes to a spare column V, so it can never unmark a kept id
        kept = torch.zeros(*scaled.shape[:-1], V + 1, dtype=torch.bool, device=scaled.device).scatter_(
            -1, torch.where(kept_token_ids >= 0, kept_token_ids, V), True)[..., :V]
        kept |= ~kept.any(-1, keepdim=True)  # no set: the whole vocabulary
        log_probs = torch.log_softmax(scaled.masked_fill(~kept, float("-inf")), dim=-1)
        # 0 log 0 = 0 off the set, with a gradient of 0 there too
        safe = log_probs.masked_fill(~kept, 0.0)
        entropy = -(safe.exp().masked_fill(~kept, 0.0) * safe).sum(-1)
    logps = log_probs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return logps, entropy


def linear_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    # In the input dtype, as the model's LM head would compute them.
    return torch.nn.functional.linear(hidden, weight, bias)


def head_logprobs(hidden: torch.Tensor, head: LMHead, targets: torch.Tensor,
                  kept_token_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logps, entropy) of hidden rows through the head, its whole logits materialized."""
    return logprobs_from_logits(linear_logits(hidden, head.weight, head.bias), targets, head.temperature,
                                head.transform, kept_token_ids)


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    bias: Optional[torch.Tensor] = None, temperature: float = 1.0,
                    return_entropy: bool = False, logit_transform: Optional[LogitTransform] = None,
                    kept_token_ids: Optional[torch.Tensor] = None):
    check_linear_inputs(hidden, weight, bias)
    check_targets("targets", targets, tuple(hidden.shape[:-1]), weight.shape[0], hidden.device)
    check_kept_token_ids(kept_token_ids, targets, weight.shape[0])
    head = LMHead(weight, bias, temperature, check_logit_transform(logit_transform))
    logps, entropy = head_logprobs(hidden, head, targets, kept_token_ids)
    return (logps, entropy) if return_entropy else logps


def grpo_loss_from_logits(logits: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          advantages: torch.Tensor, old_logps: Optional[torch.Tensor] = None,
                          ref_logps: Optional[torch.Tensor] = None, importance_ratio: Optional[torch.Tensor] = None,
                          num_items_in_batch=None, config: Optional[GRPOLossConfig] = None) -> GRPOLossOutput:
    config = check_config(config)
    check_logits(logits, temperature=config.temperature)
    B, T, V = logits.shape
    advantages = trainer_advantages(advantages, logits)
    completion_ids = ids_where_scored(completion_ids, completion_mask)
    check_targets("completion_ids", completion_ids, (B, T), V, logits.device)
    check_loss_inputs((B, T), logits.device, completion_mask, advantages, old_logps, ref_logps,
                      importance_ratio, num_items_in_batch, config)
    logps, entropy = logprobs_from_logits(logits, completion_ids, config.temperature)
    return grpo_loss_output(logps, entropy, completion_mask, advantages, old_logps, ref_logps,
                            importance_ratio, num_items_in_batch, config)


def fused_linear_grpo_loss(hidden: torch.Tensor, weight: torch.Tensor, completion_ids: torch.Tensor,
                           completion_mask: torch.Tensor, advantages: torch.Tensor,
                           bias: Optional[torch.Tensor] = None, old_logps: Optional[torch.Tensor] = None,
                           ref_logps: Optional[torch.Tensor] = None, importance_ratio: Optional[torch.Tensor] = None,
                           num_items_in_batch=None, config: Optional[GRPOLossConfig] = None,
                           logit_transform: Optional[LogitTransform] = None,
                           kept_token_ids: Optional[torch.Tensor] = None) -> GRPOLossOutput:
    config = check_config(config)
    check_linear_inputs(hidden, weight, bias)
    head = LMHead(weight, bias, config.temperature, check_logit_transform(logit_transform))
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, T, H], got shape {list(hidden.shape)}")
    B, T, _ = hidden.shape
    advantages = trainer_advantages(advantages, hidden)
    completion_ids = ids_where_scored(completion_ids, completion_mask)
    check_targets("completion_ids", completion_ids, (B, T), weight.shape[0], hidden.device)
    check_loss_inputs((B, T), hidden.device, completion_mask, advantages, old_logps, ref_logps,
                      importance_ratio, num_items_in_batch, config)
    check_kept_token_ids(kept_token_ids, completion_ids, weight.shape[0], completion_mask)
    if kept_token_ids is not None and completion_mask is not None:  # padding carries no set
        kept_token_ids = torch.where(completion_mask[..., None] != 0, kept_token_ids, -1)
    logps, entropy = head_logprobs(hidden, head, completion_ids, kept_token_ids)
    return grpo_loss_output(logps, entropy, completion_mask, advantages, old_logps, ref_logps,
                            importance_ratio, num_items_in_batch, config)

