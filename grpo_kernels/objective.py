"""The GRPO objective on per-token log-probs: the one readable source of truth for the math.

Everything in the loss depends on the logits only through the per-token log-prob `lp` and entropy
`ent`. Every path (reference, chunked torch, Triton) produces those two `[B, T]` tensors its own way and
then calls `grpo_objective`; autograd through this O(B*T) function yields `g = dLoss/dlp` and
`e = dLoss/dent`, the only two numbers per token the vocabulary-streaming backward needs.

The formulas follow TRL's `GRPOTrainer._compute_loss` (see shared/GRPO_MATH.md); the symbols below are
those of that page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .config import PPO_CLIP_LOSS_TYPES, GRPOLossConfig

METRIC_NAMES = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def nanquantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.nanquantile(values.flatten(), q)` (linear interpolation), value for value, in ops that
    torch.compile traces whole: torch 2.11's own turns a data-dependent check into a graph break, which
    `fullgraph=True` refuses. NaN when every value is NaN."""
    ordered = values.flatten().sort().values  # NaNs sort last
    rank = (((~ordered.isnan()).sum() - 1).to(ordered.dtype) * q).clamp(min=0)  # in the values' dtype, as torch's
    below = rank.long()
    lo, hi = ordered.gather(0, below.view(1)), ordered.gather(0, rank.ceil().long().view(1))
    return torch.lerp(lo, hi, rank - below).squeeze(0)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_quantile: float) -> torch.Tensor:
    """Valid tokens whose entropy is at or above the (1 - top_quantile) quantile of the valid entropies."""
    valid = mask > 0
    # NaN-out the padding instead of indexing it away: static shapes keep torch.compile graphs whole.
    entropies = torch.where(valid, entropy.detach(), float("nan"))
    threshold = nanquantile(entropies, 1.0 - top_quantile)  # NaN when nothing is valid
    return (entropy.detach() >= threshold) & valid


def vespo_weights(log_ratio: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                  importance_ratio: Optional[torch.Tensor], config: GRPOLossConfig) -> torch.Tensor:
    """VESPO's per-sequence gamma weight phi (no gradient), shape [B, 1] or [B, T] if advantages are."""
    with torch.no_grad():
        log_min = math.log(1e-8)
        log_w = (mask * log_ratio.clamp(-20.0, 20.0)).sum(-1, keepdim=True)
        if importance_ratio is not None:  # per token (validation refuses a [B, 1] ratio for vespo, as TRL does)
            # TRL clamps each token's log-ratio before the sum: a token that vLLM's token_mask mode zeroed adds
            # log(1e-8), not -inf. Where the mask is 0, TRL's ratio is 1 by construction; here it is left out.
            log_rho = importance_ratio.to(mask.dtype).log().clamp(log_min, 20.0)
            log_w = log_w + torch.where(mask > 0, log_rho, 0.0).sum(-1, keepdim=True)
        log_w = log_w.clamp(min=log_min, max=20.0)
        positive = advantages >= 0
        k = torch.where(positive, config.vespo_k_pos, config.vespo_k_neg)
        lam = torch.where(positive, config.vespo_lambda_pos, config.vespo_lambda_neg)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return torch.where(torch.isfinite(phi), phi, torch.zeros_like(phi))


def masked_batch_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # TRL: a per-sequence quantity ([B, 1], sequence-level ratios) is averaged over sequences. (TRL also takes
    # the plain mean of [B, 1] per-token values when T = 1; padded positions are never computed here, so a
    # one-token batch gets the masked mean.)
    if x.shape[-1] == 1 and mask.shape[-1] != 1:
        return x.float().mean()
    return (x.float() * mask).sum() / mask.sum().clamp(min=1.0)


def per_token_loss(
    lp: torch.Tensor,
    m: torch.Tensor,
    A: torch.Tensor,
    config: GRPOLossConfig,
    old_logps: Optional[torch.Tensor] = None,
    ref_logps: Optional[torch.Tensor] = None,
    importance_ratio: Optional[torch.Tensor] = None,
    entropy_mask: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """L[b, t] before aggregation (policy term, entropy mask, rho, + beta * kl), the importance ratio r and the
    k3 KL (None when beta = 0). lp, m, A: [B, T] (A may be [B, 1]); rows are sequences (GSPO and vespo reduce
    along them)."""
    eps_lo, eps_hi = config.epsilon_low, config.epsilon_high_value
    # Padding positions carry whatever log-probs the caller had there; zeroing their log-ratios keeps
    # exp() finite (no inf * 0 = NaN) without changing any masked sum.
    valid = m > 0

    def on_valid(x: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, x, torch.zeros_like(x))

    lp_old = lp.detach() if old_logps is None else old_logps.to(lp.dtype)
    log_ratio = lp - lp_old  # d
    if config.importance_sampling_level == "token":
        log_weight = on_valid(log_ratio)
    else:  # GSPO: one length-normalised weight per sequence
        valid_log_ratio = torch.where(valid, log_ratio, 0.0) * m
        log_weight = valid_log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp(log_weight)  # r

    if config.loss_type in PPO_CLIP_LOSS_TYPES:
        clipped = torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi)
        capped = torch.clamp(ratio, max=config.delta) if config.delta is not None else ratio
        loss = -torch.min(capped * A, clipped * A)
    elif config.loss_type == "cispo":
        loss = -torch.clamp(ratio, max=eps_hi).detach() * A * lp
    elif config.loss_type == "sapo":
        k = torch.where(A > 0, config.sapo_temperature_pos, config.sapo_temperature_neg).to(lp.dtype)
        loss = -(4.0 / k) * torch.sigmoid(k * (ratio - 1)) * A
    elif config.loss_type == "vespo":
        phi = vespo_weights(torch.where(valid, log_ratio, 0.0).detach(), m, A, importance_ratio, config)
        loss = -phi * A * lp
    else:  # pragma: no cover - GRPOLossConfig rejects unknown types
        raise ValueError(f"unknown loss_type {config.loss_type!r}")
    loss = loss.expand_as(lp)

    if entropy_mask is not None:
        loss = loss * entropy_mask
    if importance_ratio is not None and config.loss_type != "vespo":
        # A padded position's ratio is whatever the caller had there (an inf included): 1 keeps inf * 0 out.
        loss = loss * torch.where(valid, importance_ratio.to(lp.dtype), 1.0)

    kl = None
    if config.beta != 0.0:
        ref_minus_lp = on_valid(ref_logps.to(lp.dtype) - lp)
        kl = torch.exp(ref_minus_lp) - ref_minus_lp - 1  # k3 estimator
        if config.use_bias_correction_kl:
            kl = kl * ratio
        loss = loss + config.beta * kl
    return loss, ratio, kl


def grpo_objective(
    logps: torch.Tensor,
    entropy: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    config: GRPOLossConfig,
    old_logps: Optional[torch.Tensor] = None,
    ref_logps: Optional[torch.Tensor] = None,
    importance_ratio: Optional[torch.Tensor] = None,
    num_items_in_batch: Optional[torch.Tensor | float | int] = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Scalar GRPO loss and its metrics from per-token log-probs and entropies.

    logps, entropy: [B, T] float (differentiable). completion_mask: [B, T] in {0, 1}. advantages: [B] or
    [B, T]. old_logps / ref_logps / importance_ratio ([B, T] or [B, 1]): no gradient. num_items_in_batch:
    the dapo/cispo/vespo denominator (active tokens of the whole generation batch divided by the number
    of processes); the local token count when None.
    """
    lp = logps
    m = completion_mask.to(lp.dtype)
    A = (advantages[:, None] if advantages.dim() == 1 else advantages).to(lp.dtype)
    eps_lo, eps_hi = config.epsilon_low, config.epsilon_high_value

    entropy_mask = m  # the tokens the policy gradient (and the entropy bonus) act on
    if config.top_entropy_quantile < 1.0:
        entropy_mask = high_entropy_mask(entropy, m, config.top_entropy_quantile).to(lp.dtype)
    loss_per_token, ratio, kl = per_token_loss(lp, m, A, config, old_logps, ref_logps, importance_ratio,
                                               entropy_mask if config.top_entropy_quantile < 1.0 else None)

    loss = (aggregation_weights(m, config, num_items_in_batch) * loss_per_token).sum()
    if config.entropy_coef != 0.0:
        # TRL: the bonus is the mean entropy over the tokens it acts on, whatever the loss type's normaliser
        loss = loss - config.entropy_coef * (entropy * entropy_mask).sum() / entropy_mask.sum().clamp(min=1.0)

    with torch.no_grad():
        metrics = {"entropy": masked_batch_mean(entropy, m)}
        if kl is not None:
            metrics["kl"] = masked_batch_mean(kl, m)
        if config.loss_type == "cispo":
            high = (ratio > eps_hi) & (A > 0)
            low = torch.zeros_like(high)
        else:
            low = (ratio < 1 - eps_lo) & (A < 0)
            high = (ratio > 1 + eps_hi) & (A > 0)
        metrics["clip_ratio/low_mean"] = masked_batch_mean(low, m)
        metrics["clip_ratio/high_mean"] = masked_batch_mean(high, m)
        metrics["clip_ratio/region_mean"] = masked_batch_mean(low | high, m)
    return loss, metrics


def is_token_level(config: GRPOLossConfig) -> bool:
    """Whether the loss is a sum of per-token terms, each a function of its own token's lp and entropy only.
    Sequence-level weights (GSPO), vespo's sequence weight and the entropy-quantile mask need a reduction over
    tokens first."""
    return (config.importance_sampling_level == "token" and config.loss_type != "vespo"
            and config.top_entropy_quantile == 1.0)


@dataclass
class TokenInputs:
    """The per-token inputs of a token-level objective, one value per token, all [N]: token_weights from
    `aggregation_weights` and entropy_weights (the entropy bonus's per-token coefficient) fold the aggregation
    in, so the loss is the sum of `token_level_terms`."""

    mask: torch.Tensor
    advantages: torch.Tensor
    token_weights: torch.Tensor
    entropy_weights: Optional[torch.Tensor] = None
    old_logps: Optional[torch.Tensor] = None
    ref_logps: Optional[torch.Tensor] = None
    importance_ratio: Optional[torch.Tensor] = None

    def slice(self, n0: int, n1: int) -> "TokenInputs":
        return TokenInputs(**{k: None if v is None else v[n0:n1] for k, v in vars(self).items()})


def token_level_terms(lp: torch.Tensor, ent: torch.Tensor, inputs: TokenInputs,
                      config: GRPOLossConfig) -> torch.Tensor:
    """Per-token contributions to the loss of a token-level objective (`is_token_level`); they sum to
    `grpo_objective`'s loss. lp, ent and every input: [N]."""
    def row(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if x is None else x[None, :].to(lp.dtype)

    loss, _, _ = per_token_loss(lp[None, :], row(inputs.mask), row(inputs.advantages), config, row(inputs.old_logps),
                                row(inputs.ref_logps), row(inputs.importance_ratio))
    terms = inputs.token_weights.to(lp.dtype) * loss[0]
    if inputs.entropy_weights is not None:
        terms = terms - inputs.entropy_weights.to(lp.dtype) * ent
    return terms


def token_level_grads(lp: torch.Tensor, ent: torch.Tensor, inputs: TokenInputs,
                      config: GRPOLossConfig) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """g = dLoss/dlp and e = dLoss/dent per token (e is None without an entropy bonus), by differentiating
    `token_level_terms`: the spec itself, not a transcription of its derivative. torch.func, not
    torch.autograd, so that it also runs inside a custom op (where autograd does not record)."""
    def loss(lp: torch.Tensor, ent: torch.Tensor) -> torch.Tensor:
        return token_level_terms(lp, ent, inputs, config).sum()

    lp, ent = lp.detach(), ent.detach()
    if inputs.entropy_weights is None:
        return torch.func.grad(loss, argnums=0)(lp, ent), None
    return torch.func.grad(loss, argnums=(0, 1))(lp, ent)


def token_inputs(mask: torch.Tensor, advantages: torch.Tensor, config: GRPOLossConfig,
                 num_items_in_batch=None, old_logps: Optional[torch.Tensor] = None,
                 ref_logps: Optional[torch.Tensor] = None, importance_ratio: Optional[torch.Tensor] = None
                 ) -> TokenInputs:
    """TokenInputs of a [B, T] batch (advantages [B] or [B, T], importance_ratio [B, T] or [B, 1]), flattened."""
    B, T = mask.shape
    m = mask.to(torch.float32)
    token_weights = aggregation_weights(m, config, num_items_in_batch)
    # the entropy bonus is the mean entropy over the valid tokens (no entropy mask at token level)
    entropy_weights = config.entropy_coef * m / m.sum().clamp(min=1.0) if config.entropy_coef != 0.0 else None

    def flat(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if x is None:
            return None
        x = x[:, None] if x.dim() == 1 else x
        return x.expand(B, T).reshape(-1).float()

    return TokenInputs(mask=flat(m), advantages=flat(advantages), token_weights=flat(token_weights),
                       entropy_weights=flat(entropy_weights), old_logps=flat(old_logps),
                       ref_logps=flat(ref_logps if config.beta != 0.0 else None),
                       importance_ratio=flat(importance_ratio))


def aggregation_weights(mask: torch.Tensor, config: GRPOLossConfig,
                        num_items_in_batch: Optional[torch.Tensor | float | int] = None) -> torch.Tensor:
    """Per-token weights w with loss = sum_{b,t} w * L: every aggregation is linear in L.

    grpo, sapo:         mean over sequences of sum_t m L / max(1, sum_t m)  ->  w = m / (B max(1, n_b))
    bnpo:               sum m L / max(1, sum m)
    dr_grpo:            sum m L / (B * max_completion_length)
    dapo, cispo, vespo: sum m L / max(1, num_items_in_batch)  (the local sum m when not given)
    luspo:              mean over sequences of sum_t m L  (TRL 1.16; GRPO_MATH.md's mean over all B*T of
                        L * n_b is the same when L is one value per sequence, and counted padding otherwise)
    """
    m = mask
    B = m.shape[0]
    local_tokens = m.sum().clamp(min=1.0)
    loss_type = config.loss_type
    if loss_type in ("grpo", "sapo"):
        return m / (B * m.sum(-1, keepdim=True).clamp(min=1.0))
    if loss_type == "bnpo":
        return m / local_tokens
    if loss_type == "dr_grpo":
        return m / (B * config.max_completion_length)
    if loss_type in ("dapo", "cispo", "vespo"):
        if num_items_in_batch is None:
            return m / local_tokens
        return m / torch.as_tensor(num_items_in_batch, dtype=m.dtype, device=m.device).clamp(min=1.0)
    if loss_type == "luspo":
        return m / B
    raise ValueError(f"unknown loss_type {loss_type!r}")  # pragma: no cover


@dataclass
class GRPOLossOutput:
    """What every loss entry point returns."""

    loss: torch.Tensor  # scalar, differentiable
    metrics: dict[str, torch.Tensor]  # detached scalars, TRL names
    logps: torch.Tensor  # [B, T] float32, detached (reusable as old_logps)


def grpo_loss_output(logps: torch.Tensor, entropy: torch.Tensor, completion_mask: torch.Tensor,
                     advantages: torch.Tensor, old_logps: Optional[torch.Tensor], ref_logps: Optional[torch.Tensor],
                     importance_ratio: Optional[torch.Tensor], num_items_in_batch, config: GRPOLossConfig
                     ) -> GRPOLossOutput:
    """grpo_objective packaged as the entry points return it."""
    loss, metrics = grpo_objective(logps, entropy, completion_mask, advantages, config, old_logps=old_logps,
                                   ref_logps=ref_logps, importance_ratio=importance_ratio,
                                   num_items_in_batch=num_items_in_batch)
    # padded positions report log-prob 0, as the padding-free paths (which never compute them) do
    logps = torch.where(completion_mask != 0, logps.detach().float(), 0.0)
    return GRPOLossOutput(loss=loss, metrics=metrics, logps=logps)
