"""One value describing the LM head's logits, carried from the public API through the autograd glue into every
backend: the weight (and bias), the temperature, the model's logit transform, and the vocabulary shard.

The logits the softmax sees are

    logits = transform(hidden @ weight.T + bias) / temperature,
    transform(x) = softcap * tanh(scale * x / softcap)     (scale * x without a softcap)

in TRL 1.16's order (scale, then the Gemma-style tanh soft-cap, then the temperature). The backends compute
the same thing as `logit_multiplier * capped(x)` with `capped(x) = raw_softcap * tanh(x / raw_softcap)`: the
cap moved onto the raw logits (`softcap / scale`) and the scale folded into the temperature, so an unscaled,
uncapped head is exactly today's `x / temperature` and a scale alone costs nothing.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Optional

import torch


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LogitTransform:
    """What a model does to its LM head's output before the softmax.

    scale: multiplies the head's output (Cohere's `logit_scale`, Falcon-H1's `lm_head_multiplier`, Granite's
        `1 / logits_scaling`, ...). 0 makes every logit 0 (a uniform softmax), as TRL computes it.
    softcap: `softcap * tanh(x / softcap)` after the scale (Gemma 2/3's `final_logit_softcapping`); None: none.
    """

    scale: float = 1.0
    softcap: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _real("LogitTransform.scale", self.scale))
        if self.softcap is not None:
            softcap = _real("LogitTransform.softcap", self.softcap)
            if softcap <= 0:
                raise ValueError(f"LogitTransform.softcap must be > 0 (or None for no soft-cap), got {softcap!r}")
            object.__setattr__(self, "softcap", softcap)

    @property
    def is_identity(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The transform written as the models write it (the reference's definition): scale, then soft-cap."""
        logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


IDENTITY = LogitTransform()


@dataclass(frozen=True, eq=False)
class LMHead:
    """The head whose logits a backend streams: `transform(hidden @ weight.T + bias) / temperature`.

    `shard` is set for a vocabulary-parallel head (this rank's rows of the weight; see vocab_parallel.py); the
    backends themselves stream whatever rows `weight` holds and never read it.
    """

    weight: torch.Tensor
    bias: Optional[torch.Tensor] = None
    temperature: float = 1.0
    transform: LogitTransform = field(default=IDENTITY)
    shard: Optional[object] = None  # a vocab_parallel.VocabShard

    @property
    def vocab_size(self) -> int:
        """The whole vocabulary (every shard's rows)."""
        return self.weight.shape[0] if self.shard is None else self.shard.vocab_size

    @property
    def logit_multiplier(self) -> float:
        """What multiplies the (capped) raw logits: scale / temperature."""
        return self.transform.scale / self.temperature

    @property
    def raw_softcap(self) -> Optional[float]:
        """The soft-cap on the raw logits h W^T + b (softcap / scale), or None. A scale of 0 zeroes every logit,
        capped or not."""
        if self.transform.softcap is None or self.transform.scale == 0.0:
            return None
        return self.transform.softcap / self.transform.scale

    def with_tensors(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> "LMHead":
        """The same head with other weight/bias tensors (contiguous, detached, or a shard's local rows)."""
        return replace(self, weight=weight, bias=bias)

    def local(self) -> "LMHead":
        """The head a backend streams: this rank's rows, no shard."""
        return replace(self, shard=None)

    def weight_needs_grad(self) -> bool:
        return self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad)
