"""The loss types, each defined once: its per-token policy term, its aggregation and its clipping.

    loss = sum_{b,t} w[b, t] * L[b, t],    L = term(r, A, lp, ...) [* entropy mask] [* rho] [+ beta * kl]

`objective.py` builds everything around the term the same way for every loss type: the importance ratio r (per
token, or GSPO's per sequence), the entropy mask, the engine's importance ratio rho, the k3 KL, the aggregation
weights w, the metrics. A loss type only says what differs: `term` (the policy term L before those factors),
`aggregation` (how w is derived from the mask) and `clip` (which tokens its clipping acts on, for the metrics).
The built-in types are TRL 1.16's (`GRPOTrainer._compute_loss`, docs/math.md); `register_loss_type` adds
one without touching this package, and every backend and vocabulary shard runs it.

This module imports no torch at import time: GRPOLossConfig validates its loss_type here, and the CLI builds its
flags from the config without torch. The term and weight functions import torch when first called.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Optional

from .keywords import keywords_checked
from .messages import shown
from .scalars import finite_real, integer_value

if TYPE_CHECKING:
    import torch

    from .config import GRPOLossConfig


class TermInputs(NamedTuple):
    """What a per-token term may read; all [B, T] unless said (A may be [B, 1]; rows are sequences).

    Padded positions (mask 0) hold neutral values, whatever the caller had there: lp = 0, d = 0, r = 1, rho = 1,
    A = 0 (A and rho arrive [B, T]: a per-sequence value repeated along the sequence). The term's value at those positions is discarded by selection (torch.where), so no
    value computed there, finite or not, reaches the loss or a gradient. A loss type's own hyper-parameters are
    `config.loss_params` (declared with `register_loss_type(params=...)`, defaults filled in).
    """

    logps: "torch.Tensor"  # lp, differentiable
    log_ratio: "torch.Tensor"  # d = lp - lp_old, 0 at padding (lp_old = sg(lp) on-policy)
    ratio: "torch.Tensor"  # r = exp(d) per token, or GSPO's per-sequence exp(mean d) [B, 1]
    advantages: "torch.Tensor"  # A
    mask: "torch.Tensor"  # m in {0, 1}
    importance_ratio: Optional["torch.Tensor"]  # rho (the engine's / vLLM's); None: none
    config: "GRPOLossConfig"


PerTokenTerm = Callable[[TermInputs], "torch.Tensor"]
# (mask [B, T], config, num_items_in_batch) -> w [B, T] with loss = sum w * L
AggregationWeights = Callable[["torch.Tensor", "GRPOLossConfig", object], "torch.Tensor"]


# What an aggregation is a mean over, for a trainer that splits a batch into micro-batches and adds their losses:
SEQUENCES = "sequences"  # the batch's sequences (a per-sequence mean, or a fixed per-sequence normaliser)
TOKENS = "tokens"  # the batch's completion tokens
GENERATION_TOKENS = "generation_tokens"  # num_items_in_batch: the whole generation batch's tokens, not divided again


@dataclass(frozen=True)
class Aggregation:
    """How a loss type reduces its [B, T] terms: loss = sum w * L with w = weights(mask, config, num_items)."""

    name: str
    weights: AggregationWeights
    mean_over: str = SEQUENCES
    # Divided by config.max_completion_length (which the config then requires).
    reads_max_completion_length: bool = False
    # Every valid token of a sequence gets the same weight (each built-in aggregation; a weights function of a
    # user's may not): one of the conditions under which GSPO's on-policy ratio equals the per-token one
    # (objective.on_policy_token_level).
    same_within_sequence: bool = False

    @property
    def token_normalised(self) -> bool:
        """Divided by the generation batch's token count (num_items_in_batch) rather than a per-micro-batch count:
        a trainer does not divide it again by its gradient-accumulation steps."""
        return self.mean_over == GENERATION_TOKENS


def _sequence_mean(m, config, num_items):  # mean over sequences of sum_t m L / max(1, sum_t m)
    return m / (m.shape[0] * m.sum(-1, keepdim=True).clamp(min=1.0))


def _local_token_mean(m, config, num_items):  # sum m L / max(1, sum m)
    return m / m.sum().clamp(min=1.0)


def _fixed_length(m, config, num_items):  # sum m L / (B * max_completion_length)
    return m / (m.shape[0] * config.max_completion_length)


def _global_token_mean(m, config, num_items):  # sum m L / max(1, num_items_in_batch); the local sum m when None
    import torch

    if num_items is None:
        return _local_token_mean(m, config, num_items)
    return m / torch.as_tensor(num_items, dtype=m.dtype, device=m.device).clamp(min=1.0)


def _sequence_sum(m, config, num_items):  # mean over sequences of sum_t m L (TRL 1.16's luspo)
    return m / m.shape[0]


SEQUENCE_MEAN = Aggregation("sequence_mean", _sequence_mean, same_within_sequence=True)
LOCAL_TOKEN_MEAN = Aggregation("local_token_mean", _local_token_mean, mean_over=TOKENS, same_within_sequence=True)
FIXED_LENGTH = Aggregation("fixed_length", _fixed_length, reads_max_completion_length=True,
                           same_within_sequence=True)
GLOBAL_TOKEN_MEAN = Aggregation("global_token_mean", _global_token_mean, mean_over=GENERATION_TOKENS,
                                same_within_sequence=True)
SEQUENCE_SUM = Aggregation("sequence_sum", _sequence_sum, same_within_sequence=True)
AGGREGATIONS = {a.name: a for a in (SEQUENCE_MEAN, LOCAL_TOKEN_MEAN, FIXED_LENGTH, GLOBAL_TOKEN_MEAN, SEQUENCE_SUM)}

# What a loss type's clipping acts on (objective.clip_flags gives the flags, the metrics are their means):
TRUST_REGION = "trust_region"  # r (after the delta cap) outside [1 - eps_low, 1 + eps_high] against A's sign
RATIO_CAP = "ratio_cap"  # r above eps_high with A > 0 (CISPO's cap on its detached weight)
CLIPS = (TRUST_REGION, RATIO_CAP)


class Epilogue:
    """Loss ids of the fused Triton epilogue (kernels/token_objective.py), for the loss types it implements."""

    PPO_CLIP = 0
    CISPO = 1
    SAPO = 2


# The types a declared hyper-parameter may have (a config file and a command line can write these).
PARAM_TYPES = (bool, int, float, str)


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch here


@dataclass(frozen=True)
class LossParam:
    """One hyper-parameter of a registered loss type: its type, default and bounds. The value reaches the term as
    `x.config.loss_params[name]`, and is saved and logged with the config."""

    default: Any
    type: Optional[type] = None  # bool, int, float or str; None: the default's type
    minimum: Optional[float] = None  # inclusive bounds of a number
    maximum: Optional[float] = None
    choices: Optional[tuple] = None  # the allowed values, when only some are
    help: str = ""
    above: Optional[float] = None  # an exclusive lower bound (a rate, a temperature: > 0)
    # The keyword TRL's GRPOConfig and Liger's constructor give it (sapo_temperature_pos for sapo's
    # temperature_pos): accepted there, at those boundaries, and read back as an attribute of GRPOLossConfig.
    alias: Optional[str] = None

    @property
    def kind(self) -> type:
        return self.type if self.type is not None else type(self.default)

    def describe(self) -> str:
        kind = {bool: "true/false", int: "an integer", float: "a finite number", str: "a string"}[self.kind]
        bounds = [f"> {self.above:g}" if self.above is not None else "",
                  f">= {self.minimum:g}" if self.minimum is not None else "",
                  f"<= {self.maximum:g}" if self.maximum is not None else "",
                  f"one of {list(self.choices)}" if self.choices is not None else ""]
        return " ".join([kind, *[b for b in bounds if b]])

    def check(self, value: Any) -> Any:
        """The value as the term reads it (an int where a float is declared becomes a float), or ValueError."""
        kind = self.kind
        # a numpy scalar, Fraction or Decimal as the builtin it reads as (scalars.py); an int where a float is declared
        # becomes a float
        if kind in (int, float):
            number = integer_value(value) if kind is int else finite_real(value)
            fits, value = number is not None, value if number is None else number
        else:
            fits = isinstance(value, kind)
        if fits and kind in (int, float):
            fits = (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum) \
                and (self.above is None or value > self.above)
        if fits and self.choices is not None:
            fits = value in self.choices
        if not fits:
            raise ValueError(f"expected {self.describe()}, got {shown(value)}")
        if kind is float and abs(value) > FLOAT32_MAX:
            # the terms compute in the log-probs' float32: a value past its range failed inside torch ("cannot be
            # converted to type float without overflow")
            raise ValueError(f"expected {self.describe()} within float32's range (at most {FLOAT32_MAX:.7g} in "
                             f"magnitude), got {shown(value)}")
        return value


def _declared_param(name: str, spec: Any) -> LossParam:
    param = spec if isinstance(spec, LossParam) else LossParam(spec)
    if param.kind not in PARAM_TYPES:
        raise TypeError(f"params[{name!r}]: a hyper-parameter is one of {[t.__name__ for t in PARAM_TYPES]} "
                        f"(a LossParam or its default value), got {param.kind.__name__}")
    try:
        param.check(param.default)
    except ValueError as exc:
        raise ValueError(f"params[{name!r}]: the default does not fit its declaration: {exc}") from None
    return param


@dataclass(frozen=True)
class LossType:
    name: str
    term: PerTokenTerm
    aggregation: Aggregation
    # The loss's own clipping (TRUST_REGION or RATIO_CAP), or None: it does not clip, and its clip metrics report
    # the uncapped trust region for information (TRL and Liger log none for such types).
    clip: Optional[str] = None
    # Each token's term reads only its own token (no sequence reduction): the one-pass GEMM route and the Triton
    # epilogue may compute g and e per token inside the streaming pass.
    token_level: bool = False
    # The term's slope in the ratio at r = 1 is the same at every token of a sequence (it reads the sequence's
    # advantage and the config, not the token's own lp): on-policy, GSPO's sequence ratio then trains exactly as the
    # per-token one, and such a call takes the token-level route (objective.on_policy_token_level).
    ratio_slope_per_sequence: bool = False
    # A sequence's terms read that sequence's tokens alone (a token-level term, or a reduction along its own row, as
    # vespo's weight): a sequence's g = dLoss/dlp is known once its own tokens are, and the GEMM backend may take a
    # sequence-level loss in one pass over waves of whole sequences (objective.sequence_waves_apply).
    separable_by_sequence: bool = False
    # The term reads rho itself (vespo folds it into its sequence weight) instead of being multiplied by it; such a
    # type needs rho per token ([B, T]).
    folds_importance_ratio: bool = False
    epilogue: Optional[int] = None  # the Triton epilogue's id (Epilogue), None: the epilogue lacks this type
    # A per-sequence weight the term multiplies by (vespo's phi), which TRL logs as f"{name}/phi_seq_mean".
    sequence_weight: Optional[PerTokenTerm] = None
    # TRL's warnings: the paper's importance-sampling level, and whether a sequence-level ratio weights each
    # sequence by its length under this type's aggregation.
    paper_importance_sampling_level: Optional[str] = None
    warns_sequence_level: bool = False
    # The loss type's own hyper-parameters (register_loss_type's params): GRPOLossConfig.loss_params holds values.
    params: Mapping[str, LossParam] = field(default_factory=dict, compare=False, hash=False)


# ---- the built-in terms --------------------------------------------------------------------------------------

def ppo_clip_term(x: TermInputs):
    """-min(min(r, delta) A, clamp(r, 1 - eps_low, 1 + eps_high) A): PPO's clipped surrogate, TRL's delta cap."""
    c = x.config
    clipped = x.ratio.clamp(1 - c.epsilon_low, 1 + c.epsilon_high_value)
    capped = x.ratio.clamp(max=c.delta) if c.delta is not None else x.ratio
    return -(capped * x.advantages).minimum(clipped * x.advantages)


def cispo_term(x: TermInputs):
    """-sg(min(r, eps_high)) A lp."""
    return -x.ratio.clamp(max=x.config.epsilon_high_value).detach() * x.advantages * x.logps


def sapo_term(x: TermInputs):
    """-(4 / k) sigmoid(k (r - 1)) A, k the temperature of A's sign."""
    import torch

    p = x.config.loss_params
    k = torch.where(x.advantages > 0, p["temperature_pos"], p["temperature_neg"]).to(x.logps.dtype)
    return -(4.0 / k) * torch.sigmoid(k * (x.ratio - 1)) * x.advantages


# TRL clamps VESPO's log importance weights (and each vLLM log-ratio it folds in) to this range.
LOG_RATIO_RANGE = (math.log(1e-8), 20.0)


def vespo_weights(x: TermInputs):
    """VESPO's per-sequence gamma weight phi (no gradient), [B, 1] (or [B, T] if A is)."""
    import torch

    p = x.config.loss_params
    with torch.no_grad():
        log_min, log_max = LOG_RATIO_RANGE
        log_w = (x.mask * x.log_ratio.detach().clamp(-20.0, 20.0)).sum(-1, keepdim=True)
        if x.importance_ratio is not None:
            # TRL clamps each token's log-ratio before the sum: a token that vLLM's token_mask mode zeroed adds
            # log(1e-8), not -inf. Where the mask is 0, TRL's ratio is 1 by construction; here it is left out.
            log_rho = x.importance_ratio.to(x.mask.dtype).log().clamp(log_min, log_max)
            log_w = log_w + torch.where(x.mask > 0, log_rho, 0.0).sum(-1, keepdim=True)
        log_w = log_w.clamp(min=log_min, max=log_max)
        positive = x.advantages >= 0
        k = torch.where(positive, p["k_pos"], p["k_neg"])
        lam = torch.where(positive, p["lambda_pos"], p["lambda_neg"])
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return torch.where(torch.isfinite(phi), phi, torch.zeros_like(phi))


def vespo_term(x: TermInputs):
    """-phi A lp, phi the sequence's gamma weight."""
    return -vespo_weights(x) * x.advantages * x.logps


# ---- the registry ----------------------------------------------------------------------------------------------

_REGISTRY: dict[str, LossType] = {}


def _add(loss: LossType) -> LossType:
    _REGISTRY[loss.name] = loss
    return loss


def _ppo(name: str, aggregation: Aggregation, **traits) -> LossType:
    return _add(LossType(name, ppo_clip_term, aggregation, clip=TRUST_REGION, token_level=True,
                         ratio_slope_per_sequence=True, separable_by_sequence=True, epilogue=Epilogue.PPO_CLIP,
                         **traits))


# sapo's and vespo's own hyper-parameters, declared as any registered type's (TRL's names are their aliases).
SAPO_PARAMS = {
    "temperature_pos": LossParam(1.0, float, above=0.0, alias="sapo_temperature_pos",
                                 help="sapo: gate temperature for positive advantages"),
    "temperature_neg": LossParam(1.05, float, above=0.0, alias="sapo_temperature_neg",
                                 help="sapo: gate temperature for negative advantages"),
}
# phi = w^k exp(lam (1 - w)), a gamma-shaped weight of the sequence's ratio w: a shape k >= 0 and a rate lam > 0
# keep it bounded (lam <= 0 grows without bound in w; TRL clamps lam at 1e-4)
VESPO_PARAMS = {
    "k_pos": LossParam(2.0, float, minimum=0.0, alias="vespo_k_pos", help="vespo: shape k for positive advantages"),
    "lambda_pos": LossParam(3.0, float, above=0.0, alias="vespo_lambda_pos",
                            help="vespo: rate lambda for positive advantages"),
    "k_neg": LossParam(3.0, float, minimum=0.0, alias="vespo_k_neg", help="vespo: shape k for negative advantages"),
    "lambda_neg": LossParam(2.0, float, above=0.0, alias="vespo_lambda_neg",
                            help="vespo: rate lambda for negative advantages"),
}
GSPO_LOSS_TYPE = _ppo("grpo", SEQUENCE_MEAN).name  # GSPO: this type with importance_sampling_level="sequence"
_ppo("bnpo", LOCAL_TOKEN_MEAN, warns_sequence_level=True)
_ppo("dr_grpo", FIXED_LENGTH, warns_sequence_level=True)
DEFAULT_LOSS_TYPE = _ppo("dapo", GLOBAL_TOKEN_MEAN, warns_sequence_level=True).name
# cispo's slope in r is 0 (its weight is detached); sapo's at r = 1 is -A whatever its temperature
_add(LossType("cispo", cispo_term, GLOBAL_TOKEN_MEAN, clip=RATIO_CAP, token_level=True, ratio_slope_per_sequence=True,
              separable_by_sequence=True, epilogue=Epilogue.CISPO, warns_sequence_level=True))
_add(LossType("sapo", sapo_term, SEQUENCE_MEAN, token_level=True, ratio_slope_per_sequence=True,
              separable_by_sequence=True, epilogue=Epilogue.SAPO, params=SAPO_PARAMS))
_ppo("luspo", SEQUENCE_SUM, paper_importance_sampling_level="sequence")
_add(LossType("vespo", vespo_term, GLOBAL_TOKEN_MEAN, folds_importance_ratio=True, sequence_weight=vespo_weights,
              separable_by_sequence=True, params=VESPO_PARAMS))
BUILTIN_LOSS_TYPES = tuple(_REGISTRY)


def loss_type_names() -> tuple[str, ...]:
    """Every registered loss type, the built-in ones first."""
    return tuple(_REGISTRY)


def get_loss_type(name: object) -> LossType:
    """The registered loss type `name`; one clear error listing the registered ones otherwise."""
    loss = _REGISTRY.get(name) if isinstance(name, str) else None
    if loss is None:
        raise ValueError(f"loss_type must be one of the registered loss types {loss_type_names()}, got {shown(name)} "
                         "(grpo_kernels.register_loss_type adds one)")
    return loss


def loss_param_aliases() -> dict[str, tuple[str, str]]:
    """{alias: (loss type, hyper-parameter)} of every declared hyper-parameter that has one (TRL's names)."""
    return {param.alias: (loss.name, name) for loss in _REGISTRY.values() for name, param in loss.params.items()
            if param.alias is not None}


def validate_loss_params(loss_type: str, params: Optional[Mapping[str, Any]], key: str = "loss_params"
                         ) -> dict[str, Any]:
    """The hyper-parameters of `loss_type` from `params` (a mapping name -> value), checked against its declaration
    and completed with the defaults, in declaration order. Each error is one ValueError naming `key`.name, the
    loss type and what was expected. (The engine's config schema calls this for its `loss.params`.)"""
    declared = get_loss_type(loss_type).params
    params = {} if params is None else params
    if not isinstance(params, Mapping):
        raise ValueError(f"{key}: expected a mapping of hyper-parameter names to values, got {shown(params)}")
    for name in params:
        if name not in declared:
            offered = f"it declares {list(declared)}" if declared else "it declares none"
            raise ValueError(f"{key}.{name}: loss_type {loss_type!r} has no hyper-parameter {name!r}; {offered}")
    values = {}
    for name, param in declared.items():
        try:
            values[name] = param.check(params[name]) if name in params else param.default
        except ValueError as exc:
            raise ValueError(f"{key}.{name}: loss_type {loss_type!r} {exc}") from None
    return values


def _require_arity(name: str, function: Callable, count: int, expected: str) -> None:
    """A function the objective will call with `count` positional arguments takes them: refused here, at
    registration, rather than by Python's own error (naming a `<lambda>`) on the first loss computed with it."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a signature: its call will tell
        return
    try:
        signature.bind(*range(count))
    except TypeError:
        raise TypeError(f"{name} must be a callable {expected} (taking {count} positional argument"
                        f"{'s' if count > 1 else ''}), got {getattr(function, '__qualname__', type(function).__name__)}"
                        f"{signature}") from None


@keywords_checked
def register_loss_type(name: str, term: PerTokenTerm, aggregation: str | Aggregation | AggregationWeights, *,
                       clip: Optional[str] = None, token_level: bool = False,
                       ratio_slope_per_sequence: bool = False, separable_by_sequence: bool = False,
                       folds_importance_ratio: bool = False, params: Optional[Mapping[str, Any]] = None,
                       replace: bool = False) -> LossType:
    """Add a loss type: GRPOLossConfig(loss_type=name) then runs it on every backend and vocabulary shard.

    term: `term(x: TermInputs) -> L` [B, T] (or [B, 1]: one value per sequence), the policy term before the
        entropy mask, rho and the KL, written in torch ops of x.logps / x.ratio / x.log_ratio / x.advantages /
        x.mask (differentiable through lp; what must not carry a gradient, detach), in x.logps's dtype. It is
        differentiated by autograd: no derivative to write. Its result is checked on every call: any other shape
        ([B] included, even when B == T) or dtype is an error naming the loss type.
    aggregation: a name of AGGREGATIONS ("sequence_mean", "local_token_mean", "fixed_length", "global_token_mean",
        "sequence_sum"), an Aggregation, or a function (mask, config, num_items_in_batch) -> w.
    clip: TRUST_REGION or RATIO_CAP when the term clips the ratio that way (the clip metrics follow it), None
        otherwise.
    token_level: True only if each token's L reads that token alone (no sum over a sequence): the GEMM backend
        then computes g and e inside its streaming pass. False (the safe default) takes the two-step route:
        statistics, this objective by autograd, gradients from g = dLoss/dlp and e = dLoss/dent.
    ratio_slope_per_sequence: True only if dL/dr at r = 1 is the same at every token of a sequence (it reads x.ratio,
        the sequence's advantage and the config, not x.logps): on-policy, GSPO's sequence-level ratio then takes
        the token-level route (with token_level, and an aggregation whose weights are the same within a sequence:
        each built-in one).
    separable_by_sequence: True only if a sequence's L reads that sequence's tokens alone (token_level implies it):
        a sequence-level call then may run in one pass over waves of whole sequences on the GEMM backend, each
        wave's g taken from this objective once the wave's sequences are complete. False (the safe default) keeps
        the two-step route.
    folds_importance_ratio: the term reads x.importance_ratio itself instead of L being multiplied by it.
    params: the loss type's own hyper-parameters, {name: LossParam(default, type, minimum, maximum, choices)} or
        {name: default} (the type is the default's: bool, int, float or str). A config sets them with
        GRPOLossConfig(loss_type=name, loss_params={...}), checked by validate_loss_params; the term reads
        x.config.loss_params[name].
    replace: registering a name that is already registered is an error unless this is True.
    """
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        raise ValueError(f"name must be an ASCII identifier (letters, digits, '_'; a loss_type value), got {name!r:.60}")
    # Names are compared case-insensitively: 'GRPO' beside 'grpo' would be two objectives one letter apart. ASCII
    # only, since Unicode has letters that look like or fold to others ('ＧＲＰＯ' in full width, the Latin 'ɡ').
    if name in BUILTIN_LOSS_TYPES:
        raise ValueError(f"{name!r} is a built-in loss type; pick another name")
    builtin = next((other for other in BUILTIN_LOSS_TYPES if other.lower() == name.lower()), None)
    if builtin is not None:
        raise ValueError(f"{name!r} differs from the built-in loss type {builtin!r} only in case (names are compared "
                         f"case-insensitively); pick another name")
    taken = next((other for other in _REGISTRY if other.lower() == name.lower() and other != name), None)
    if taken is not None:
        raise ValueError(f"{name!r} differs from the registered loss type {taken!r} only in case (names are compared "
                         f"case-insensitively); pick another name, or unregister_loss_type({taken!r}) first")
    if name in _REGISTRY and not replace:
        raise ValueError(f"loss type {name!r} is already registered; pass replace=True to replace it "
                         f"(or unregister_loss_type({name!r}) first)")
    if not callable(term):
        raise TypeError(f"term must be a callable term(x: TermInputs) -> tensor, got {type(term).__name__}")
    _require_arity("term", term, 1, "term(x: TermInputs) -> tensor")
    for flag, value in (("token_level", token_level), ("ratio_slope_per_sequence", ratio_slope_per_sequence),
                        ("separable_by_sequence", separable_by_sequence),
                        ("folds_importance_ratio", folds_importance_ratio), ("replace", replace)):
        if not isinstance(value, bool):  # bool("False") is True: a string here would turn the switch on
            raise TypeError(f"{flag} must be True or False, got {shown(value)}")
    if isinstance(aggregation, str):
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {tuple(AGGREGATIONS)}, an Aggregation or a weights "
                             f"function, got {aggregation!r}")
        aggregation = AGGREGATIONS[aggregation]
    elif not isinstance(aggregation, Aggregation):
        if not callable(aggregation):
            raise TypeError(f"aggregation must be a name, an Aggregation or a callable, got "
                            f"{type(aggregation).__name__}")
        _require_arity("aggregation", aggregation, 3, "weights(mask, config, num_items_in_batch) -> w")
        aggregation = Aggregation(f"{name}_aggregation", aggregation)  # a mean over sequences, for trainers
    if clip is not None and clip not in CLIPS:
        raise ValueError(f"clip must be None or one of {CLIPS}, got {clip!r}")
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of names to LossParam or default values, got "
                        f"{type(params).__name__}")
    for param_name in params or {}:
        if not isinstance(param_name, str) or not param_name.isidentifier():
            raise ValueError(f"params: a hyper-parameter name must be an identifier, got {param_name!r}")
    declared = {param_name: _declared_param(param_name, spec) for param_name, spec in (params or {}).items()}
    return _add(LossType(name, term, aggregation, clip=clip, token_level=bool(token_level),
                         ratio_slope_per_sequence=bool(ratio_slope_per_sequence),
                         separable_by_sequence=bool(separable_by_sequence or token_level),
                         folds_importance_ratio=bool(folds_importance_ratio), params=declared))


def unregister_loss_type(name: str) -> None:
    """Remove a loss type added by register_loss_type (the built-in ones stay)."""
    if name in BUILTIN_LOSS_TYPES:
        raise ValueError(f"{name!r} is a built-in loss type and cannot be removed")
    _REGISTRY.pop(name, None)
