"""The public functions: validate, pick a backend, stream the log-probs, apply the objective."""

from __future__ import annotations

from typing import Literal, Optional, Union

import torch

from . import ops, reference
from .config import PPO_CLIP_LOSS_TYPES, GRPOLossConfig
from .objective import GRPOLossOutput, aggregation_weights, grpo_loss_output, masked_batch_mean
from .validation import check_config, check_linear_inputs, check_logits, check_loss_inputs, check_targets

Backend = Literal["auto", "triton", "torch", "reference"]
BACKENDS = ("auto", "triton", "torch", "reference")


def resolve_backend(backend: str, device: torch.device) -> str:
    """'auto' is Triton on CUDA (when triton is installed) and the chunked torch path elsewhere."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch"
        return "triton"
    return "torch"


def _checking_values() -> bool:
    # Value checks (NaN scans, id ranges) synchronise with the device and would break a compiled graph;
    # under torch.compile only the static shape/dtype/device checks run.
    return not torch.compiler.is_compiling()


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    bias: Optional[torch.Tensor] = None, temperature: float = 1.0, return_entropy: bool = False,
                    backend: Backend = "auto") -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Per-token float32 log-probs of `targets` (and entropies) under softmax((hidden W^T + bias) / temperature).

    hidden [..., H], weight [V, H], targets [...] int64. Differentiable w.r.t. hidden, weight and bias; no
    [tokens, vocab] tensor is ever allocated (except by backend='reference').
    """
    backend = resolve_backend(backend, hidden.device if isinstance(hidden, torch.Tensor) else torch.device("cpu"))
    if backend == "reference":
        return reference.linear_logprobs(hidden, weight, targets, bias, temperature, return_entropy)
    check_linear_inputs(hidden, weight, bias, check_finite=_checking_values())
    if _checking_values():
        check_targets("targets", targets, tuple(hidden.shape[:-1]), weight.shape[0], hidden.device)
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logps, entropy = ops.linear_logprobs(hidden.reshape(-1, hidden.shape[-1]), weight, bias, targets.reshape(-1),
                                         temperature, backend)
    logps, entropy = logps.view(targets.shape), entropy.view(targets.shape)
    return (logps, entropy) if return_entropy else logps


def fused_linear_grpo_loss(hidden: torch.Tensor, weight: torch.Tensor, completion_ids: torch.Tensor,
                           completion_mask: torch.Tensor, advantages: torch.Tensor,
                           bias: Optional[torch.Tensor] = None, old_logps: Optional[torch.Tensor] = None,
                           ref_logps: Optional[torch.Tensor] = None,
                           importance_ratio: Optional[torch.Tensor] = None,
                           num_items_in_batch: Optional[Union[torch.Tensor, int, float]] = None,
                           config: Optional[GRPOLossConfig] = None,
                           backend: Backend = "auto") -> GRPOLossOutput:
    """The GRPO loss from the policy's last hidden states [B, T, H] and LM head [V, H], without logits."""
    config = check_config(config)
    backend = resolve_backend(backend, hidden.device if isinstance(hidden, torch.Tensor) else torch.device("cpu"))
    if backend == "reference":
        return reference.fused_linear_grpo_loss(hidden, weight, completion_ids, completion_mask, advantages, bias,
                                                old_logps, ref_logps, importance_ratio, num_items_in_batch, config)
    check_linear_inputs(hidden, weight, bias, check_finite=_checking_values())
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, T, H], got shape {list(hidden.shape)}")
    B, T, H = hidden.shape
    if _checking_values():
        check_targets("completion_ids", completion_ids, (B, T), weight.shape[0], hidden.device)
        check_loss_inputs((B, T), hidden.device, completion_mask, advantages, old_logps, ref_logps,
                          importance_ratio, num_items_in_batch, config)
    if backend == "triton" and fuses_objective_in_epilogue(config):
        return _token_level_in_epilogue(hidden.reshape(B * T, H), weight, bias, completion_ids.reshape(B * T),
                                        completion_mask, advantages, old_logps, ref_logps, importance_ratio,
                                        num_items_in_batch, config)
    logps, entropy = ops.linear_logprobs(hidden.reshape(B * T, H), weight, bias, completion_ids.reshape(B * T),
                                         config.temperature, backend)
    return grpo_loss_output(logps.view(B, T), entropy.view(B, T), completion_mask, advantages, old_logps,
                            ref_logps, importance_ratio, num_items_in_batch, config)


def grpo_loss_from_logits(logits: torch.Tensor, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                          advantages: torch.Tensor, old_logps: Optional[torch.Tensor] = None,
                          ref_logps: Optional[torch.Tensor] = None, importance_ratio: Optional[torch.Tensor] = None,
                          num_items_in_batch: Optional[Union[torch.Tensor, int, float]] = None,
                          config: Optional[GRPOLossConfig] = None, backend: Backend = "auto") -> GRPOLossOutput:
    """The GRPO loss from logits [B, T, V] the caller already has; no second [B, T, V] tensor is made."""
    config = check_config(config)
    backend = resolve_backend(backend, logits.device if isinstance(logits, torch.Tensor) else torch.device("cpu"))
    if backend == "reference":
        return reference.grpo_loss_from_logits(logits, completion_ids, completion_mask, advantages, old_logps,
                                               ref_logps, importance_ratio, num_items_in_batch, config)
    check_logits(logits, check_finite=_checking_values())
    B, T, V = logits.shape
    if _checking_values():
        check_targets("completion_ids", completion_ids, (B, T), V, logits.device)
        check_loss_inputs((B, T), logits.device, completion_mask, advantages, old_logps, ref_logps,
                          importance_ratio, num_items_in_batch, config)
    logps, entropy = ops.logits_logprobs(logits, completion_ids, config.temperature, backend)
    return grpo_loss_output(logps, entropy, completion_mask, advantages, old_logps, ref_logps,
                            importance_ratio, num_items_in_batch, config)



def fuses_objective_in_epilogue(config: GRPOLossConfig) -> bool:
    """Token-level objectives are closed-form per token, so the Triton forward computes them (and g) in its
    epilogue. Sequence-level weights (GSPO, vespo) and the entropy quantile mask need a reduction over
    tokens first; they take the log-probs through the autograd objective instead."""
    return (config.importance_sampling_level == "token" and config.loss_type != "vespo"
            and config.top_entropy_quantile == 1.0)


def _token_level_in_epilogue(hidden, weight, bias, targets, completion_mask, advantages, old_logps, ref_logps,
                             importance_ratio, num_items_in_batch, config) -> GRPOLossOutput:
    B, T = completion_mask.shape
    mask = completion_mask.to(torch.float32)
    token_weights = aggregation_weights(mask, config, num_items_in_batch)
    # the entropy bonus is the mean entropy over the valid tokens (no entropy mask on this path)
    entropy_weights = config.entropy_coef * mask / mask.sum().clamp(min=1.0) if config.entropy_coef != 0.0 else None
    advantages = (advantages[:, None] if advantages.dim() == 1 else advantages).expand(B, T)
    if importance_ratio is not None:
        importance_ratio = importance_ratio.expand(B, T)
    loss_kind = 0 if config.loss_type in PPO_CLIP_LOSS_TYPES else {"cispo": 1, "sapo": 2}[config.loss_type]
    terms, logps, entropy, kl, clip = ops.linear_grpo_token_terms(
        hidden, weight, bias, targets, advantages, token_weights, entropy_weights, old_logps,
        ref_logps if config.beta != 0.0 else None, importance_ratio, mask, config.temperature, loss_kind, config)
    with torch.no_grad():
        clip = clip.view(B, T)
        metrics = {"entropy": masked_batch_mean(entropy.view(B, T), mask)}
        if config.beta != 0.0:
            metrics["kl"] = masked_batch_mean(kl.view(B, T), mask)
        metrics["clip_ratio/low_mean"] = masked_batch_mean((clip & 1) != 0, mask)
        metrics["clip_ratio/high_mean"] = masked_batch_mean((clip & 2) != 0, mask)
        metrics["clip_ratio/region_mean"] = masked_batch_mean(clip != 0, mask)
    return GRPOLossOutput(loss=terms.sum(), metrics=metrics, logps=logps.detach().view(B, T))
