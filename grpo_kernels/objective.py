"""The GRPO objective on per-token log-probs: the one readable source of truth for the math.

Everything in the loss depends on the logits only through the per-token log-prob `lp` and entropy
`ent`. Every path (reference, chunked torch, Triton) produces those two `[B, T]` tensors its own way and
then calls `grpo_objective`; autograd through this O(B*T) function yields `g = dLoss/dlp` and
`e = dLoss/dent`, the only two numbers per token the vocabulary-streaming backward needs.

The formulas follow TRL's `GRPOTrainer._compute_loss` (docs/math.md states them); the symbols below are
those of that page.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import NamedTuple, Optional

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .config import GRPOLossConfig, LossConfigWarning
from .losses import BUILTIN_LOSS_TYPES, RATIO_CAP, TRUST_REGION, LossType, TermInputs, get_loss_type
from .saved_tensor_hooks import lifted_saved_tensor_hooks

METRIC_NAMES = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean")


def nanquantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """`torch.nanquantile(values.flatten(), q)` (linear interpolation), value for value, in ops that
    torch.compile traces whole: torch 2.11's own turns a data-dependent check into a graph break, which
    `fullgraph=True` refuses. NaN when every value is NaN, and when there are none (an empty batch): one NaN is
    appended, which sorts last and is read only when no value is valid."""
    flat = values.flatten()
    ordered = torch.cat([flat, flat.new_full((1,), float("nan"))]).sort().values  # NaNs sort last
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


def masked_batch_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # TRL: a per-sequence quantity ([B, 1], sequence-level ratios) is averaged over sequences. (TRL also takes
    # the plain mean of [B, 1] per-token values when T = 1; padded positions are never computed here, so a
    # one-token batch gets the masked mean.)
    # (statically: a packed batch's length is data-dependent under torch.compile, and a [B, 1] value is [B, 1])
    if statically_known_true(x.shape[-1] == 1) and not statically_known_true(mask.shape[-1] == 1):
        return x.float().mean()
    return torch.where(mask > 0, x.float(), 0.0).sum() / mask.sum().clamp(min=1.0)


def importance_weights(lp: torch.Tensor, m: torch.Tensor, old_logps: Optional[torch.Tensor], level: str
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, r): the per-token log-ratio d = lp - lp_old (0 at padding; lp_old = sg(lp) on-policy) and the
    importance ratio r, exp(d) per token or GSPO's exp(length-normalised sum of d) per sequence [B, 1]."""
    # Padding positions carry whatever log-probs the caller had there; zeroing their log-ratios keeps exp()
    # finite (no inf * 0 = NaN) without changing any masked sum.
    lp_old = lp.detach() if old_logps is None else old_logps.to(lp.dtype)
    log_ratio = torch.where(m > 0, lp - lp_old, 0.0)
    if level == "token":
        return log_ratio, torch.exp(log_ratio)
    log_weight = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return log_ratio, torch.exp(log_weight)


def clip_flags(ratio: torch.Tensor, A: torch.Tensor, config: GRPOLossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) bool: the tokens (or sequences) the loss type's clipping acts on. TRL 1.16's definition: the
    trust region after the delta cap (so with delta < 1 + epsilon_high nothing reads as high-clipped), CISPO's
    cap on r > epsilon_high; a type that does not clip reports the uncapped trust region."""
    clip = get_loss_type(config.loss_type).clip
    if clip == RATIO_CAP:
        high = (ratio > config.epsilon_high_value) & (A > 0)
        return torch.zeros_like(high), high
    if clip == TRUST_REGION and config.delta is not None:
        ratio = ratio.clamp(max=config.delta)
    return (ratio < 1 - config.epsilon_low) & (A < 0), (ratio > 1 + config.epsilon_high_value) & (A > 0)


def ratio_clip_flags(logps: torch.Tensor, completion_mask: torch.Tensor, advantages: torch.Tensor,
                     config: GRPOLossConfig, old_logps: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """`clip_flags` of detached log-probs [B, T] (a loss's `logps` output): (low, high) as float, [B, T] or [B, 1]
    (sequence-level ratios), for callers that log more than the loss's metrics (per-sequence extremes)."""
    with torch.no_grad():
        m = completion_mask.to(logps.dtype)
        A = (advantages[:, None] if advantages.dim() == 1 else advantages).to(logps.dtype)
        _, ratio = importance_weights(logps, m, old_logps, config.importance_sampling_level)
        low, high = clip_flags(ratio, A, config)
        return low.float(), high.float()


def checked_term(loss_type: str, term: object, lp: torch.Tensor) -> torch.Tensor:
    """A loss type's term result, refused unless it is [B, T] or [B, 1] in lp's dtype: a [B] result (one value per
    sequence, unsqueezed nowhere) would broadcast along the wrong axis when B == T, silently."""
    B, T = lp.shape

    def expected() -> str:  # formatted only to raise: under torch.compile the sizes may be symbolic
        return f"[B, T] = [{B}, {T}] (one value per token) or [B, 1] = [{B}, 1] (one per sequence)"

    if not isinstance(term, torch.Tensor):
        raise TypeError(f"loss type {loss_type!r}: its term returned {type(term).__name__}, expected a tensor "
                        f"{expected()}")
    # Under torch.compile the length may be data-dependent (packed rows): the selection that follows refuses a
    # length that does not broadcast, and the checks here are those that read static sizes.
    if term.dim() != 2 or term.shape[0] != B or (not torch.compiler.is_compiling() and term.shape[1] not in (T, 1)):
        raise ValueError(f"loss type {loss_type!r}: its term returned shape {list(term.shape)}, expected {expected()}")
    if term.dtype != lp.dtype:
        raise TypeError(f"loss type {loss_type!r}: its term returned {term.dtype}, expected {lp.dtype} (the dtype "
                        f"of x.logps)")
    if term.device != lp.device:  # it failed in the selection that follows, in torch's words
        raise ValueError(f"loss type {loss_type!r}: its term returned a tensor on {term.device}, expected {lp.device} "
                         f"(the device of x.logps)")
    return term


def run_term(loss_type: LossType, inputs: TermInputs, lp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The loss type's term on `inputs`, checked (checked_term). A registered (user) term is also held to what the
    objective relies on, each broken promise an error naming the loss type rather than a wrong loss or a failure
    deep in autograd: it leaves its inputs as they were (the ratio feeds the KL's correction and the clip
    metrics after it), its result carries a gradient to the log-probs whenever they need one, and it is finite at
    every scored position (the padded ones are dropped whatever they hold)."""
    if loss_type.name in BUILTIN_LOSS_TYPES:
        return checked_term(loss_type.name, loss_type.term(inputs), lp)
    compiling = torch.compiler.is_compiling()  # data-dependent checks (versions, values) only when eager
    versions = [] if compiling else [(name, t._version) for name, t in zip(inputs._fields, inputs)
                                     if isinstance(t, torch.Tensor)]
    try:
        term = checked_term(loss_type.name, loss_type.term(inputs), lp)
    except Exception as exc:
        exc.add_note(f"in the term of loss type {loss_type.name!r} (register_loss_type)")
        raise
    changed = [name for name, version in versions if getattr(inputs, name)._version != version]
    if changed:
        raise RuntimeError(f"loss type {loss_type.name!r}: its term changed x.{', x.'.join(changed)} in place; a "
                           f"term must compute a new tensor from its inputs")
    if torch.is_grad_enabled() and lp.requires_grad and not term.requires_grad:
        raise RuntimeError(f"loss type {loss_type.name!r}: its term carries no gradient to x.logps (detached, or not "
                           f"computed from x.logps / x.log_ratio / x.ratio): the loss would not train the policy")
    if not compiling:
        bad = ~torch.isfinite(term.detach()) & valid
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"loss type {loss_type.name!r}: its term is NaN or infinite at {int(bad.sum())} scored "
                             f"position(s), the first at [{b}, {t}]")
    return term


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
    """L[b, t] before aggregation (the loss type's term, entropy mask, rho, + beta * kl), the importance ratio r and
    the k3 KL (None when beta = 0). lp, m, A: [B, T] (A may be [B, 1]); rows are sequences (GSPO and vespo reduce
    along them)."""
    loss_type = get_loss_type(config.loss_type)
    valid = m > 0
    log_ratio, ratio = importance_weights(lp, m, old_logps, config.importance_sampling_level)
    # Padded positions hold whatever the caller had there (NaN, inf): the term sees neutral values instead, and
    # its result there is dropped by selection, so nothing computed at a padded position reaches the loss or a
    # gradient (a multiplication by 0 would turn an inf or a NaN there into a NaN loss).
    # (A and rho [B, 1] arrive along T; selecting on their shape would be data-dependent under torch.compile.)
    rho = None if importance_ratio is None else torch.where(valid, importance_ratio.to(lp.dtype), 1.0)
    inputs = TermInputs(torch.where(valid, lp, 0.0), log_ratio, ratio, torch.where(valid, A, 0.0), m, rho, config)
    loss = torch.where(valid, run_term(loss_type, inputs, lp, valid), 0.0)
    if entropy_mask is not None:
        loss = torch.where(entropy_mask > 0, loss, 0.0)
    if rho is not None and not loss_type.folds_importance_ratio:
        loss = loss * rho

    kl = None
    if config.beta != 0.0:
        ref_minus_lp = torch.where(m > 0, ref_logps.to(lp.dtype) - lp, 0.0)
        kl = torch.exp(ref_minus_lp) - ref_minus_lp - 1  # k3 estimator
        if config.use_bias_correction_kl:
            kl = kl * ratio
        loss = loss + config.beta * kl
    return loss, ratio, kl


def objective_loss(
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
    """`grpo_objective` (objective_entry.py) on inputs already checked: the API's routes call this, inside torch.func
    transforms and compiled graphs too."""
    lp = logps
    m = completion_mask.to(lp.dtype)
    A = (advantages[:, None] if advantages.dim() == 1 else advantages).to(lp.dtype)

    entropy_mask = m  # the tokens the policy gradient (and the entropy bonus) act on
    if config.top_entropy_quantile < 1.0:
        entropy_mask = high_entropy_mask(entropy, m, config.top_entropy_quantile).to(lp.dtype)
    loss_per_token, ratio, kl = per_token_loss(lp, m, A, config, old_logps, ref_logps, importance_ratio,
                                               entropy_mask if config.top_entropy_quantile < 1.0 else None)

    valid = m > 0
    loss = torch.where(valid, aggregation_weights(m, config, num_items_in_batch) * loss_per_token, 0.0).sum()
    if config.entropy_coef != 0.0:
        # TRL: the bonus is the mean entropy over the tokens it acts on, whatever the loss type's normaliser
        bonus = torch.where(entropy_mask > 0, entropy, 0.0).sum() / entropy_mask.sum().clamp(min=1.0)
        loss = loss - config.entropy_coef * bonus

    with torch.no_grad():
        low, high = clip_flags(ratio, A, config)
        metrics = _metrics(masked_batch_mean(entropy, m), None if kl is None else masked_batch_mean(kl, m),
                           masked_batch_mean(low, m), masked_batch_mean(high, m), masked_batch_mean(low | high, m))
    return loss, metrics


def _metrics(entropy, kl, low, high, region) -> dict[str, torch.Tensor]:
    metrics = {"entropy": entropy}
    if kl is not None:
        metrics["kl"] = kl
    metrics.update({"clip_ratio/low_mean": low, "clip_ratio/high_mean": high, "clip_ratio/region_mean": region})
    return metrics


def is_token_level(config: GRPOLossConfig) -> bool:
    """Whether the loss is a sum of per-token terms, each a function of its own token's lp and entropy only.
    Sequence-level weights (GSPO), a loss type that reduces over a sequence (vespo's weight) and the
    entropy-quantile mask need a reduction over tokens first."""
    return (config.importance_sampling_level == "token" and get_loss_type(config.loss_type).token_level
            and config.top_entropy_quantile == 1.0)


def sequence_waves_apply(config: GRPOLossConfig) -> bool:
    """Whether a loss that is not token-level may run in one pass over waves of whole sequences
    (backends/gemm.py: stream_sequence_waves): each sequence's g = dLoss/dlp must be known once that sequence's own
    tokens are (the loss type separable by sequence, and no entropy-quantile mask, which ranks every token of the
    batch), and no entropy term may reach the gradient (its d ent / d z is not the Q the store keeps). The aggregation
    weights read the mask and the config only, never lp: constants of the wave."""
    return (not is_token_level(config) and get_loss_type(config.loss_type).separable_by_sequence
            and config.top_entropy_quantile == 1.0 and config.entropy_coef == 0.0)


def on_policy_token_level(config: GRPOLossConfig, *, on_policy: bool, importance_ratio: bool,
                          advantages_per_sequence: bool) -> GRPOLossConfig:
    """`config`, or where GSPO's sequence-level ratio is on-policy, the same config at the token level: the same loss,
    metrics and gradients on the call's inputs, and a token-level call (one pass on the GEMM path, not two).
    on_policy: no old log-probs given; importance_ratio: a rho given; advantages_per_sequence: [B] (or [S] packed).

    On-policy (lp_old = sg(lp)) every ratio is 1 in value. The sequence ratio
    r_i = exp(sum_t m_t d_t / |o_i|) has slope m_t / |o_i| in lp_t, so sum_t w_t f(r_i) gives token t of sequence i
    the gradient (m_t / |o_i|) sum_{t' in i} w_t' m_t' f'(1), and the per-token ratio gives it w_t m_t f'(1): the
    same when w (Aggregation.same_within_sequence) and f'(1) (LossType.ratio_slope_per_sequence, one advantage a
    sequence, no rho multiplying L) are the same at every token of a sequence, no entropy mask selects tokens within
    it and the KL is not multiplied by the ratio. The clip metrics agree when nothing reads as clipped at r = 1
    (a sequence's flag is averaged over sequences, a token's over tokens)."""
    if config.importance_sampling_level != "sequence" or not on_policy or importance_ratio:
        return config
    loss = get_loss_type(config.loss_type)
    if not (advantages_per_sequence and loss.token_level and loss.ratio_slope_per_sequence
            and loss.aggregation.same_within_sequence and config.top_entropy_quantile == 1.0
            and not (config.beta != 0.0 and config.use_bias_correction_kl)):
        return config
    if torch.compiler.is_compiling():  # the flags below are a (tiny) computation Dynamo would have to trace
        return config
    with torch.no_grad():
        low, high = clip_flags(torch.ones(2, dtype=torch.float64), torch.tensor([-1.0, 1.0], dtype=torch.float64),
                               config)
    if bool((low | high).any()):
        return config
    with warnings.catch_warnings():  # the caller's config was checked (and warned about) as given
        warnings.simplefilter("ignore", LossConfigWarning)
        return replace(config, importance_sampling_level="token")


@dataclass
class TokenInputs:
    """The per-token inputs of a token-level objective, one value per token, all [N]: token_weights from
    `aggregation_weights` and entropy_weights (the entropy bonus's per-token coefficient) fold the aggregation
    in, so the loss is the sum of the per-token terms of `token_level_step`."""

    mask: torch.Tensor
    advantages: torch.Tensor
    token_weights: torch.Tensor
    entropy_weights: Optional[torch.Tensor] = None
    old_logps: Optional[torch.Tensor] = None
    ref_logps: Optional[torch.Tensor] = None
    importance_ratio: Optional[torch.Tensor] = None

    def slice(self, n0: int, n1: int) -> "TokenInputs":
        return TokenInputs(**{k: None if v is None else v[n0:n1] for k, v in vars(self).items()})

    def ready(self) -> "TokenInputs":
        """float32 and contiguous, as the kernels and custom ops take them."""
        return TokenInputs(**{k: None if v is None else v.reshape(-1).float().contiguous()
                              for k, v in vars(self).items()})


class TokenStep(NamedTuple):
    """Everything the objective gives per token [N], from one evaluation: the Triton epilogue's outputs."""

    terms: torch.Tensor  # the loss's per-token contributions: their sum is grpo_objective's loss
    grad_logps: torch.Tensor  # g = dLoss/dlp
    grad_entropy: Optional[torch.Tensor]  # e = dLoss/dent (None without an entropy bonus)
    kl: torch.Tensor  # the k3 KL (0 when beta = 0)
    clip: torch.Tensor  # int8: bit 0 low-clipped, bit 1 high-clipped (clip_flags)


def _token_terms(lp: torch.Tensor, ent: torch.Tensor, inputs: TokenInputs, config: GRPOLossConfig):
    def row(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if x is None else x[None, :].to(lp.dtype)

    A = row(inputs.advantages)
    loss, ratio, kl = per_token_loss(lp[None, :], row(inputs.mask), A, config, row(inputs.old_logps),
                                     row(inputs.ref_logps), row(inputs.importance_ratio))
    terms = inputs.token_weights.to(lp.dtype) * loss[0]
    if inputs.entropy_weights is not None:
        terms = terms - inputs.entropy_weights.to(lp.dtype) * ent
    terms = torch.where(inputs.mask > 0, terms, 0.0)  # a padded token's entropy (or weight) reaches nothing
    low, high = clip_flags(ratio, A, config)
    clip = (low.to(torch.int8) + 2 * high.to(torch.int8))[0]
    return terms, (torch.zeros_like(lp) if kl is None else kl[0]), clip


def token_level_step(lp: torch.Tensor, ent: torch.Tensor, inputs: TokenInputs, config: GRPOLossConfig) -> TokenStep:
    """The token-level objective (`is_token_level`) of lp, ent [N] and its derivatives g and e, by differentiating
    the spec itself (not a transcription of its derivative). torch.func, not torch.autograd, so that it also runs
    inside a custom op (where autograd does not record)."""
    def total(lp: torch.Tensor, ent: torch.Tensor):
        terms, kl, clip = _token_terms(lp, ent, inputs, config)
        return terms.sum(), (terms.detach(), kl.detach(), clip)

    lp, ent = lp.detach(), ent.detach()
    with lifted_saved_tensor_hooks():  # the caller's (save_on_cpu, checkpoint): torch.func refuses to run under them
        if inputs.entropy_weights is None:
            g, (terms, kl, clip) = torch.func.grad(total, argnums=0, has_aux=True)(lp, ent)
            return TokenStep(terms, g, None, kl, clip)
        (g, e), (terms, kl, clip) = torch.func.grad(total, argnums=(0, 1), has_aux=True)(lp, ent)
    return TokenStep(terms, g, e, kl, clip)


def token_metrics(entropy: torch.Tensor, kl: torch.Tensor, clip: torch.Tensor, mask: torch.Tensor,
                  config: GRPOLossConfig) -> dict[str, torch.Tensor]:
    """grpo_objective's metrics from per-token outputs [N] (a TokenStep's, or the Triton epilogue's)."""
    with torch.no_grad():
        m = mask.float()
        low, high = (clip & 1) != 0, (clip & 2) != 0
        return _metrics(masked_batch_mean(entropy, m), masked_batch_mean(kl, m) if config.beta != 0.0 else None,
                        masked_batch_mean(low, m), masked_batch_mean(high, m), masked_batch_mean(low | high, m))


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
    """Per-token weights w with loss = sum_{b,t} w * L: every aggregation is linear in L (losses.Aggregation)."""
    loss_type = get_loss_type(config.loss_type)
    registered = loss_type.name not in BUILTIN_LOSS_TYPES
    try:
        weights = loss_type.aggregation.weights(mask, config, num_items_in_batch)
    except Exception as exc:
        if registered:
            exc.add_note(f"in the aggregation of loss type {loss_type.name!r} (register_loss_type)")
        raise
    if not isinstance(weights, torch.Tensor) or weights.shape != mask.shape or not weights.is_floating_point() \
            or weights.device != mask.device:
        elsewhere = isinstance(weights, torch.Tensor) and weights.device != mask.device
        got = (f"{weights.dtype} {list(weights.shape)}" + (f" on {weights.device}" if elsewhere else "")
               if isinstance(weights, torch.Tensor) else type(weights).__name__)
        raise ValueError(f"loss type {loss_type.name!r}: its aggregation {loss_type.aggregation.name!r} returned "
                         f"{got}, expected floating weights of the mask's shape {list(mask.shape)}"
                         + (f" on {mask.device}" if elsewhere else ""))
    # a registered aggregation's weights are held to what its term is held to (run_term): finite where scored
    if registered and not torch.compiler.is_compiling() and bool((~torch.isfinite(weights) & (mask > 0)).any()):
        raise ValueError(f"loss type {loss_type.name!r}: its aggregation {loss_type.aggregation.name!r} returned NaN "
                         f"or infinite weights where the mask is 1")
    return weights


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
    loss, metrics = objective_loss(logps, entropy, completion_mask, advantages, config, old_logps=old_logps,
                                   ref_logps=ref_logps, importance_ratio=importance_ratio,
                                   num_items_in_batch=num_items_in_batch)
    # padded positions report log-prob 0, as the padding-free paths (which never compute them) do
    logps = torch.where(completion_mask != 0, logps.detach().float(), 0.0)
    return GRPOLossOutput(loss=loss, metrics=metrics, logps=logps)
