"""The token-level GRPO objective as a @triton.jit epilogue: per token, the weighted loss term w * L and
its derivative g = w * dL/dlp, plus the KL and clip flags for the metrics.

It transcribes the loss types of `grpo_kernels.losses` that name an `Epilogue` id, inside
`grpo_kernels.objective.objective_loss` (the spec; `grpo_objective` to callers), for token-level importance weights,
including torch's gradient conventions at ties (min of equal terms splits the gradient in half; clamp passes it at the bounds),
and is tested against that spec through the whole loss. The clip flags are `objective.clip_flags`'s (TRL 1.16:
after the delta cap)."""

import triton
import triton.language as tl

from ..losses import Epilogue, get_loss_type

# the spec's ids as compile-time constants of the kernel
PPO_CLIP: tl.constexpr = tl.constexpr(Epilogue.PPO_CLIP)
CISPO: tl.constexpr = tl.constexpr(Epilogue.CISPO)
SAPO: tl.constexpr = tl.constexpr(Epilogue.SAPO)


def epilogue_args(config) -> dict:
    """The kernel's loss id and scalars for a GRPOLossConfig whose loss type has an epilogue."""
    loss_kind = get_loss_type(config.loss_type).epilogue
    if loss_kind is None:
        raise ValueError(f"loss_type={config.loss_type!r} has no Triton epilogue; it takes the two-step route")
    return dict(loss_kind=loss_kind, eps_low=config.epsilon_low, eps_high=config.epsilon_high_value,
                delta=None if config.delta is None else float(config.delta), beta=float(config.beta),
                sapo_pos=float(config.sapo_temperature_pos), sapo_neg=float(config.sapo_temperature_neg),
                bias_correction=bool(config.use_bias_correction_kl))


@triton.jit
def token_objective(lp, old, ref, adv, rho, mask, weight, eps_low, eps_high, delta, beta, sapo_pos, sapo_neg,
                    LOSS_KIND: tl.constexpr, HAS_OLD: tl.constexpr, HAS_REF: tl.constexpr, HAS_RHO: tl.constexpr,
                    HAS_DELTA: tl.constexpr, BIAS_CORRECTION: tl.constexpr):
    valid = mask > 0
    d_dlp = tl.where(valid, 1.0, 0.0)  # padding log-ratios are pinned to 0, so they carry no gradient
    log_ratio = tl.zeros_like(lp)
    if HAS_OLD:
        log_ratio = tl.where(valid, lp - old, 0.0)
    ratio = tl.exp(log_ratio)
    dratio = ratio * d_dlp  # on-policy (no old): ratio 1, gradient that of lp

    if LOSS_KIND == PPO_CLIP:  # PPO clip: -min(min(r, delta) A, clamp(r, 1-eps_lo, 1+eps_hi) A)
        clipped = tl.minimum(tl.maximum(ratio, 1.0 - eps_low), 1.0 + eps_high)
        dclipped = tl.where((ratio >= 1.0 - eps_low) & (ratio <= 1.0 + eps_high), dratio, 0.0)
        capped = ratio
        dcapped = dratio
        if HAS_DELTA:
            capped = tl.minimum(ratio, delta)
            dcapped = tl.where(ratio <= delta, dratio, 0.0)
        unclipped_term = capped * adv
        clipped_term = clipped * adv
        loss = -tl.minimum(unclipped_term, clipped_term)
        dterm = tl.where(unclipped_term < clipped_term, dcapped,
                         tl.where(unclipped_term > clipped_term, dclipped, 0.5 * (dcapped + dclipped)))
        dloss = -adv * dterm
        low = (capped < 1.0 - eps_low) & (adv < 0)  # TRL 1.16: clipping flagged after the delta cap
        high = (capped > 1.0 + eps_high) & (adv > 0)
    elif LOSS_KIND == CISPO:  # CISPO: -sg(min(r, eps_hi)) A lp
        cap = tl.minimum(ratio, eps_high)
        loss = -cap * adv * lp
        dloss = -cap * adv
        low = ratio != ratio  # all False: CISPO has no lower clip
        high = (ratio > eps_high) & (adv > 0)
    else:  # SAPO (no clipping; the uncapped trust region reported): -(4/k) sigmoid(k (r - 1)) A
        k = tl.where(adv > 0, sapo_pos, sapo_neg)
        gate = tl.sigmoid(k * (ratio - 1.0))
        loss = -(4.0 / k) * gate * adv
        dloss = -4.0 * adv * gate * (1.0 - gate) * dratio
        low = (ratio < 1.0 - eps_low) & (adv < 0)
        high = (ratio > 1.0 + eps_high) & (adv > 0)

    if HAS_RHO:
        loss = loss * rho
        dloss = dloss * rho
    kl = tl.zeros_like(lp)
    if HAS_REF:
        ref_minus_lp = tl.where(valid, ref - lp, 0.0)
        kl = tl.exp(ref_minus_lp) - ref_minus_lp - 1.0  # k3
        dkl = -(tl.exp(ref_minus_lp) - 1.0) * d_dlp
        if BIAS_CORRECTION:
            dkl = dkl * ratio + kl * dratio
            kl = kl * ratio
        loss += beta * kl
        dloss += beta * dkl
    return weight * loss, weight * dloss, kl, low, high
