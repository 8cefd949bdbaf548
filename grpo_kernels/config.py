"""GRPOLossConfig: the loss hyper-parameters, named and defaulted as TRL 1.16's GRPOConfig.

Every default here is GRPOConfig's (tests/grpo_kernels/test_grpo_loss_config.py compares them with a real `trl.GRPOConfig()`).
FusedLinearGRPOLoss keeps Liger's constructor defaults instead (beta 0.04, use_bias_correction_kl False,
max_completion_length None); docs/integrations.md lists the differences.
"""

from __future__ import annotations

import inspect
import sys
import warnings
import typing
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, Callable, Literal, Mapping, NamedTuple, Optional

from .losses import (DEFAULT_LOSS_TYPE, FLOAT32_MAX, GSPO_LOSS_TYPE, TRUST_REGION, get_loss_type,
                     loss_param_aliases, validate_loss_params)
from .keywords import accepted_keywords, closest_name, refuse_unknown_keywords
from .messages import shown
from .read_only_params import ReadOnlyParams
from .scalars import finite_real, integer_value, same_value

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


class LossConfigWarning(UserWarning):
    """A combination of options that TRL accepts with a warning (it does not follow the loss type's paper)."""

# Fields of ours that TRL's GRPOConfig has no counterpart of (every other field is one of GRPOConfig's).
OWN_FIELDS = ("loss_params",)


class ReadCondition(NamedTuple):
    text: str
    holds: Callable[[Any], bool]
    when_true: Mapping[str, Any]
    when_false: Mapping[str, Any]


@dataclass(frozen=True)
class LossSetting:
    """The declaration of one loss setting, beside its field: its meaning and its bounds (the type is the field's).
    GRPOLossConfig checks every value against it; the engine's `loss` section, FusedLinearGRPOLoss's constructor
    and the docs are derived from it."""

    help: str
    ge: Optional[float] = None  # bounds of a number: >=, >, <=
    gt: Optional[float] = None
    le: Optional[float] = None
    # When the objective reads it (None: always): what a user sets ("beta != 0"), a predicate of the config, and
    # settings that make it hold / fail ({"beta": 0.04} / {"beta": 0.0}).
    read_when: Optional[ReadCondition] = None
    # A bound on the importance ratio: it changes nothing while the ratio stays 1, as it does when each batch gets
    # one optimisation pass (old log-probs = the current ones). The caller that knows the passes says so (the
    # engine: optim.num_iterations).
    bounds_the_ratio: bool = False

    def float_bounds(self) -> dict[str, float]:
        """The bounds of a float setting: its own, within float32's range where it declares none. The objective
        computes in the log-probs' float32: past 3.4e38 an epsilon or delta failed inside torch ("value cannot be
        converted to type float without overflow") and a beta or entropy_coef made the loss inf or NaN silently."""
        bounds = {key: getattr(self, key) for key in ("ge", "gt", "le") if getattr(self, key) is not None}
        if "ge" not in bounds and "gt" not in bounds:
            bounds["ge"] = -FLOAT32_MAX
        bounds.setdefault("le", FLOAT32_MAX)
        return bounds

    def bounds_text(self) -> str:
        low = f">= {self.ge:g}" if self.ge is not None else f"> {self.gt:g}" if self.gt is not None else ""
        if self.le is not None:
            return f"in {'[' if self.ge is not None else '('}{self.ge if self.ge is not None else self.gt:g}, " \
                   f"{self.le:g}]" if low else f"<= {self.le:g}"
        return low


# The smallest temperature: the kernels and the samplers divide float32 logits by it, and float32 ends at 3.4e38
# (and holds no value below 1.4e-45: 1e-300 is 0 there), so at 1e-40 every backend's log-probs were NaN (triton's
# loss finite beside them). From 1e-30 up, logits of magnitude up to 1e8 stay finite.
MIN_TEMPERATURE = 1e-30
# The largest temperature, its mirror: the kernels multiply the logits by 1 / temperature, and below 1e-30 (the
# smallest factor the soft-cap's check takes too) every logit up to 1e8 in magnitude becomes less than 1e-22, which
# exp rounds to exactly 1 in float32: the samples are uniform whatever the model says and the loss has no gradient
# (3e38 trained nothing, silently).
MAX_TEMPERATURE = 1e30  # written out: 1 / MIN_TEMPERATURE rounds to 9.999999999999999e29, which refused 1e30


def setting(default: Any, help: str, **declaration: Any) -> Any:
    """A GRPOLossConfig field with its declaration (LossSetting)."""
    return field(default=default, metadata={"setting": LossSetting(help, **declaration)})


def _kl_on(config: Any) -> bool:
    return config.beta != 0


def _trust_region(config: Any) -> bool:
    return get_loss_type(config.loss_type).clip == TRUST_REGION


def _clips(config: Any) -> bool:
    return get_loss_type(config.loss_type).clip is not None


def _reads_epsilon(config: Any) -> bool:
    # the trust region's lower edge; a ratio cap (cispo) reads epsilon only as epsilon_high's stand-in
    return _trust_region(config) or (_clips(config) and config.epsilon_high is None)


# sapo gates the ratio smoothly and vespo weights it: neither clips, so an epsilon set with them changed nothing.
_CLIPPING = ReadCondition("loss_type grpo, bnpo, dr_grpo, dapo, luspo or cispo (one that clips the ratio)", _clips,
                          {"loss_type": "grpo"}, {"loss_type": "sapo"})
_LOWER_CLIP = ReadCondition("loss_type grpo, bnpo, dr_grpo, dapo or luspo (one that clips the ratio from below), "
                            "or cispo with epsilon_high null", _reads_epsilon,
                            {"loss_type": "grpo"}, {"loss_type": "sapo"})


@dataclass(frozen=True)
class GRPOLossConfig:
    loss_type: str = setting(DEFAULT_LOSS_TYPE, "the objective, by TRL's names; grpo_kernels.register_loss_type "
                                                "adds one")
    # >= 0: below 0 the KL term would reward drifting from the reference
    beta: float = setting(0.0, "KL coefficient against the starting model (0: no reference model)", ge=0.0)
    epsilon: float = setting(0.2, "lower clipping range of the importance ratio (1 - epsilon)", ge=0.0,
                             read_when=_LOWER_CLIP, bounds_the_ratio=True)
    epsilon_high: Optional[float] = setting(None, "upper clipping range (1 + epsilon_high; null: epsilon)", ge=0.0,
                                            read_when=_CLIPPING, bounds_the_ratio=True)
    delta: Optional[float] = setting(None, "two-sided clipping: cap on the importance ratio (> 1; null: off)", gt=1.0,
                                     read_when=ReadCondition("loss_type grpo, bnpo, dr_grpo, dapo or luspo (one "
                                                             "that clips to a trust region)", _trust_region,
                                                             {"loss_type": "grpo"}, {"loss_type": "cispo"}),
                                     bounds_the_ratio=True)
    importance_sampling_level: Literal["token", "sequence"] = setting(
        "token", "importance ratio per token or per sequence (GSPO)")
    temperature: float = setting(1.0, "the temperature the completions were sampled at (the log-probs are taken "
                                      "at it)", ge=MIN_TEMPERATURE, le=MAX_TEMPERATURE)
    max_completion_length: Optional[int] = setting(512, "the longest completion: the fixed normaliser of the "
                                                        "loss types that divide by it (dr_grpo)", ge=1)
    use_bias_correction_kl: bool = setting(True, "weight the KL by the importance ratio (off-policy correction; "
                                                 "TRL's default since 1.10)",
                                           read_when=ReadCondition("beta != 0", _kl_on, {"beta": 0.04}, {"beta": 0.0}))
    entropy_coef: float = setting(0.0, "entropy bonus coefficient (0: off)")
    top_entropy_quantile: float = setting(1.0, "train only on the highest-entropy fraction of tokens (1: all)",
                                          gt=0.0, le=1.0)
    # A loss type's own hyper-parameters (sapo's, vespo's, register_loss_type(params=...)'s), not TRL's fields:
    # checked against its declaration and completed with its defaults, so the saved and logged config holds every
    # value. TRL's names of sapo's and vespo's (sapo_temperature_pos, ...) are accepted as keywords (their
    # LossParam aliases) and read back as attributes.
    loss_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        loss = get_loss_type(self.loss_type)
        hints = _field_types(type(self))
        for f in fields(self):
            declaration = f.metadata.get("setting")
            if declaration is not None:
                value = getattr(self, f.name)
                checked = _check_setting(f.name, value, hints[f.name], declaration)
                if checked is not value:  # a numpy scalar, Fraction or Decimal: stored as the builtin it reads as
                    object.__setattr__(self, f.name, checked)
        params = validate_loss_params(self.loss_type, self.loss_params)
        object.__setattr__(self, "loss_params", ReadOnlyParams.of(params))
        if loss.aggregation.reads_max_completion_length and self.max_completion_length is None:
            raise ValueError(f"loss_type={self.loss_type!r} needs max_completion_length (its fixed normaliser)")
        self._warn_like_trl(loss)

    def _warn_like_trl(self, loss) -> None:
        """TRL accepts these combinations but warns that they do not follow the papers; so do we."""
        paper_level = loss.paper_importance_sampling_level
        if paper_level is not None and self.importance_sampling_level != paper_level:
            warn_at_caller(f"loss_type={self.loss_type!r} follows its paper with "
                            f"importance_sampling_level={paper_level!r}")
        if self.importance_sampling_level == "sequence" and loss.warns_sequence_level:
            warn_at_caller(f"importance_sampling_level='sequence' with loss_type={self.loss_type!r} weights each "
                            f"sequence by its length; GSPO uses loss_type={GSPO_LOSS_TYPE!r}")

    def __hash__(self) -> int:  # loss_params is a (read-only) dict, as asdict, JSON and YAML write it: hash its items
        return hash(tuple((f.name, tuple(sorted(self.loss_params.items())) if f.name == "loss_params"
                           else getattr(self, f.name)) for f in fields(self)))

    @property
    def epsilon_low(self) -> float:
        return float(self.epsilon)

    @property
    def epsilon_high_value(self) -> float:
        return float(self.epsilon if self.epsilon_high is None else self.epsilon_high)

    def __getattr__(self, name: str) -> Any:
        """TRL's name of a loss type's hyper-parameter (sapo_temperature_pos): its value for this config's loss type,
        else the declared default (which the objective does not read)."""
        alias = loss_param_aliases().get(name)
        if alias is None or "loss_params" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        loss_type, param = alias
        if loss_type == self.__dict__["loss_type"]:
            return self.__dict__["loss_params"][param]
        return get_loss_type(loss_type).params[param].default

    @classmethod
    def from_trl(cls, trl_config: object) -> "GRPOLossConfig":
        """Build from a TRL GRPOConfig, any object with its attribute names, or a mapping of them (its to_dict(), a
        loaded YAML or JSON); missing ones keep our defaults. One that holds none of them is refused: a dict read
        by attribute, None or another object gave the default config, silently."""
        names = [f.name for f in fields(cls) if f.name not in OWN_FIELDS] + list(loss_param_aliases())
        if isinstance(trl_config, Mapping):
            given = {name: trl_config[name] for name in names if name in trl_config}
        else:
            given = {name: getattr(trl_config, name) for name in names if hasattr(trl_config, name)}
        _refuse_misspelt_trl_names(trl_config, names)
        if not given:
            raise TypeError(f"GRPOLossConfig.from_trl takes a trl.GRPOConfig, or an object or mapping with its "
                            f"field names ({', '.join(names[:4])}, ...), got {shown(trl_config)}, which has none of "
                            f"them")
        return cls(**given)


def _trl_argument_names() -> frozenset[str]:
    """The names of TRL's GRPOConfig (its training arguments too), or none where TRL is not installed."""
    try:
        import dataclasses
        from trl import GRPOConfig
    except Exception:  # TRL is optional (an ImportError, or one of its own dependencies' errors): no names known
        return frozenset()
    return frozenset(f.name for f in dataclasses.fields(GRPOConfig))


def _refuse_misspelt_trl_names(source: object, names: list[str]) -> None:
    """TypeError for a key of `source` (a mapping's keys, an object's own attributes) that is a typo of one of our
    `names` (`epsilon_hgh`) and no argument of TRL's: it was left out, and the setting meant kept its default,
    silently. Other keys (TRL's learning_rate, output_dir, ...) are TRL's business."""
    keys = source.keys() if isinstance(source, Mapping) else _attribute_names(source)
    close = {key: closest_name(key, names, cutoff=0.8) for key in keys if isinstance(key, str) and key not in names}
    close = {key: meant for key, meant in close.items() if meant is not None}
    if close:
        close = {key: meant for key, meant in close.items() if key not in _trl_argument_names()}
    for key, meant in close.items():
        raise TypeError(f"GRPOLossConfig.from_trl: {key!r:.60} is no argument of TRL's GRPOConfig; did you mean "
                        f"{meant!r}? (it was left out, and {meant} would keep its default)")


def _attribute_names(source: object) -> set[str]:
    """The names an object answers getattr with, as from_trl reads it: its own attributes and the public names of its
    class too (a dataclass with __slots__ has no __dict__, a property lives on the class: a typo there was missed)."""
    own = set(vars(source)) if hasattr(source, "__dict__") else set()
    return own | {name for name in dir(source) if not name.startswith("_")}


_dataclass_init = GRPOLossConfig.__init__
_DATACLASS_KEYWORDS = accepted_keywords(_dataclass_init)


def _init_with_aliases(self: GRPOLossConfig, *args: Any, **kwargs: Any) -> None:
    """The dataclass's __init__, taking TRL's names of loss-type hyper-parameters (sapo_temperature_pos=...) as
    keywords at this boundary: each goes into loss_params under its declared name when it belongs to the chosen
    loss type, and is not read otherwise (as in TRL, where every loss type's options are set and one is read)."""
    aliases = loss_param_aliases()
    refuse_unknown_keywords("GRPOLossConfig", [*(_DATACLASS_KEYWORDS or ()), *aliases], kwargs)
    given = {name: kwargs.pop(name) for name in list(kwargs) if name in aliases}
    given = {name: value for name, value in given.items() if value is not None}  # None: not given
    if given:
        loss_type = args[0] if args else kwargs.get("loss_type", DEFAULT_LOSS_TYPE)
        params = dict(kwargs.get("loss_params") or {})
        for name, value in given.items():
            owner, param = aliases[name]
            if owner != loss_type:
                continue
            try:  # checked here, so that a refusal names the keyword the caller wrote, not loss_params.<param>
                value = get_loss_type(loss_type).params[param].check(value)
            except ValueError as exc:
                raise ValueError(f"{name}: loss_type {loss_type!r} {exc}") from None
            if param in params and params[param] != value:
                raise ValueError(f"{name}={shown(value)} and loss_params[{param!r}]={shown(params[param])} set the "
                                 f"same hyper-parameter of loss_type {loss_type!r}; give one")
            params[param] = value
        kwargs["loss_params"] = params
    _dataclass_init(self, *args, **kwargs)


_init_with_aliases.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    *inspect.signature(_dataclass_init).parameters.values(),
    *(inspect.Parameter(alias, inspect.Parameter.KEYWORD_ONLY, default=None) for alias in loss_param_aliases())])
GRPOLossConfig.__init__ = _init_with_aliases  # type: ignore[method-assign]


def check_setting(name: str, value: Any, shown_as: Optional[str] = None, config_class: Optional[type] = None) -> None:
    """`value` against the declaration of setting `name` (of GRPOLossConfig, or `config_class`), the error naming
    it `shown_as` (a boundary's own name for it, e.g. Liger's epsilon_low for epsilon)."""
    config_class = GRPOLossConfig if config_class is None else config_class
    field_ = next(f for f in fields(config_class) if f.name == name)
    _check_setting(shown_as or name, value, _field_types(config_class)[name], field_.metadata["setting"])


@lru_cache(maxsize=None)
def _field_types(config_class: type) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def _allowed(annotation: Any) -> tuple[Optional[type], bool, Optional[tuple]]:
    """(the value's type, whether None is allowed, the allowed values of a Literal) of a field's annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is Literal:
        return str, False, args
    if type(None) in args:
        kind, _, choices = _allowed(next(arg for arg in args if arg is not type(None)))
        return kind, True, choices
    return annotation, False, None


def _check_setting(name: str, value: Any, annotation: Any, declaration: LossSetting) -> Any:
    """`value` against the field's type and its declaration: TypeError for another type, ValueError past a bound.
    Returns the value to store: the caller's own, or the builtin int / float a numpy scalar, Fraction or Decimal
    reads as (scalars.py)."""
    kind, nullable, choices = _allowed(annotation)
    if value is None and nullable:
        return value
    if choices is not None:
        # compared by type first: `in` would compare a tensor elementwise
        if not any(type(value) is type(choice) and value == choice for choice in choices):
            raise ValueError(f"{name} must be one of {choices}, got {shown(value)}")
        return value
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be {'True or False' if kind is bool else 'a string'}, got {shown(value)}")
        return value
    number = integer_value(value) if kind is int else finite_real(value)
    bounds = declaration.bounds_text()
    within = number is not None and (declaration.ge is None or number >= declaration.ge) and (
        declaration.gt is None or number > declaration.gt) and (declaration.le is None or number <= declaration.le)
    if kind is int and not within:
        raise ValueError(f"{name} must be a positive int, got {shown(value)}" if declaration.ge == 1 else
                         f"{name} must be an int {bounds}, got {shown(value)}")
    if number is None:
        raise TypeError(f"{name} must be {'None or ' if nullable else ''}a finite number (an int, float, numpy "
                        f"scalar, Fraction or Decimal), got {shown(value)}")
    if not within:
        raise ValueError(f"{name} must be {bounds}, got {shown(value)}")
    if abs(number) > FLOAT32_MAX:  # LossSetting.float_bounds
        raise ValueError(f"{name} must be within float32's range (at most {FLOAT32_MAX:.7g} in magnitude: the "
                         f"objective computes in float32), got {shown(value)}")
    return same_value(value, number)


def warn_at_caller(message: str, category: type[Warning] = LossConfigWarning) -> None:
    """A warning attributed to the first frame outside grpo_kernels, the dataclass machinery and torch.nn's module
    call: the line that built the config (or called the loss, or the loss module). A fixed stacklevel would point at
    the dataclass's generated `__init__` (`<string>`), into the package when the config is built by one of its own
    functions, or at torch's Module._call_impl."""
    frame, level = sys._getframe(1), 2  # stacklevel 2 is the frame that called this function
    while frame is not None and (_module_root(frame) in ("grpo_kernels", "dataclasses")
                                 or frame.f_globals.get("__name__", "") == "torch.nn.modules.module"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def _module_root(frame) -> str:
    return frame.f_globals.get("__name__", "").partition(".")[0]
