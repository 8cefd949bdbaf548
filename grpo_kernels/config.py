"""GRPOLossConfig: the loss hyper-parameters, named and defaulted as TRL 1.16's GRPOConfig.

Every default here is GRPOConfig's (tests/grpo_kernels/test_grpo_loss_config.py compares them with a real `trl.GRPOConfig()`).
FusedLinearGRPOLoss keeps Liger's constructor defaults instead (beta 0.04, use_bias_correction_kl False,
max_completion_length None); docs/integrations.md lists the differences.
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping, Optional

from .losses import DEFAULT_LOSS_TYPE, GSPO_LOSS_TYPE, get_loss_type, validate_loss_params

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


class LossConfigWarning(UserWarning):
    """A combination of options that TRL accepts with a warning (it does not follow the loss type's paper)."""

# Fields of ours that TRL's GRPOConfig has no counterpart of (every other field is one of GRPOConfig's).
OWN_FIELDS = ("loss_params",)


@dataclass(frozen=True)
class GRPOLossConfig:
    loss_type: str = DEFAULT_LOSS_TYPE  # a registered loss type (losses.py: TRL's, and any register_loss_type adds)
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: Optional[float] = None
    delta: Optional[float] = None
    importance_sampling_level: Literal["token", "sequence"] = "token"
    temperature: float = 1.0
    max_completion_length: Optional[int] = 512  # only dr_grpo reads it (its fixed normaliser)
    use_bias_correction_kl: bool = True  # TRL's default since 1.10 (DeepSeek-V3.2's importance-weighted KL)
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    # A registered loss type's own hyper-parameters (register_loss_type(params=...)), not TRL's: checked against
    # its declaration and completed with its defaults, so the saved and logged config holds every value.
    loss_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        loss = get_loss_type(self.loss_type)
        object.__setattr__(self, "loss_params", validate_loss_params(self.loss_type, self.loss_params))
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                f"got {self.importance_sampling_level!r}"
            )
        for name in ("beta", "epsilon", "temperature", "sapo_temperature_pos", "sapo_temperature_neg",
                     "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "entropy_coef",
                     "top_entropy_quantile"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"{name} must be a finite number, got {value!r}")
        for name in ("epsilon_high", "delta"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise TypeError(f"{name} must be None or a finite number, got {value!r}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.epsilon < 0 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ValueError("epsilon and epsilon_high must be >= 0")
        if self.delta is not None and self.delta <= 1.0:
            # TRL's two-sided clipping caps the ratio at delta; a cap at or below 1 would clip on-policy tokens.
            raise ValueError(f"delta must be > 1 (it caps the importance ratio), got {self.delta}")
        if self.sapo_temperature_pos <= 0 or self.sapo_temperature_neg <= 0:
            raise ValueError("sapo_temperature_pos and sapo_temperature_neg must be > 0")
        if not 0.0 < self.top_entropy_quantile <= 1.0:
            raise ValueError(f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile}")
        if loss.aggregation.reads_max_completion_length and self.max_completion_length is None:
            raise ValueError(f"loss_type={self.loss_type!r} needs max_completion_length (its fixed normaliser)")
        if self.max_completion_length is not None and (
            isinstance(self.max_completion_length, bool) or not isinstance(self.max_completion_length, int)
            or self.max_completion_length <= 0
        ):
            raise ValueError(f"max_completion_length must be a positive int, got {self.max_completion_length!r}")

        self._warn_like_trl(loss)

    def _warn_like_trl(self, loss) -> None:
        """TRL accepts these combinations but warns that they do not follow the papers; so do we."""
        paper_level = loss.paper_importance_sampling_level
        if paper_level is not None and self.importance_sampling_level != paper_level:
            _warn_at_caller(f"loss_type={self.loss_type!r} follows its paper with "
                            f"importance_sampling_level={paper_level!r}")
        if self.importance_sampling_level == "sequence" and loss.warns_sequence_level:
            _warn_at_caller(f"importance_sampling_level='sequence' with loss_type={self.loss_type!r} weights each "
                            f"sequence by its length; GSPO uses loss_type={GSPO_LOSS_TYPE!r}")

    def __hash__(self) -> int:  # loss_params is a dict (what asdict, JSON and YAML write); hash its items
        return hash(tuple((f.name, tuple(sorted(self.loss_params.items())) if f.name == "loss_params"
                           else getattr(self, f.name)) for f in fields(self)))

    @property
    def epsilon_low(self) -> float:
        return float(self.epsilon)

    @property
    def epsilon_high_value(self) -> float:
        return float(self.epsilon if self.epsilon_high is None else self.epsilon_high)

    @classmethod
    def from_trl(cls, trl_config: object) -> "GRPOLossConfig":
        """Build from any object with TRL GRPOConfig attribute names (missing ones keep our defaults)."""
        kwargs = {f.name: getattr(trl_config, f.name) for f in fields(cls)
                  if f.name not in OWN_FIELDS and hasattr(trl_config, f.name)}
        return cls(**kwargs)


def _warn_at_caller(message: str) -> None:
    """A UserWarning attributed to the first frame outside grpo_kernels and the dataclass machinery: the line
    that built the config. A fixed stacklevel would point at the dataclass's generated `__init__`
    (`<string>`), or into the package when the config is built by one of its own functions."""
    frame, level = sys._getframe(1), 2  # stacklevel 2 is the frame that called this function
    while frame is not None and _module_root(frame) in ("grpo_kernels", "dataclasses"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, LossConfigWarning, stacklevel=level)


def _module_root(frame) -> str:
    return frame.f_globals.get("__name__", "").partition(".")[0]
