"""One value describing the LM head's logits, carried from the public API through the autograd glue into every
backend: the weight (and bias), the temperature, the model's logit transform, and the vocabulary shard.

The logits the softmax sees are

    logits = transform(hidden @ weight.T + bias) / temperature,
    transform(x) = softcap * tanh(scale * x / softcap)     (scale * x without a softcap)

in TRL 1.16's order (scale, then the Gemma-style tanh soft-cap, then the temperature). Every backend computes
them from the raw logits z = h W^T + b with the two numbers of `LMHead.logit_constants`: `inv_tau * z` without
a soft-cap (inv_tau = scale / temperature: an uncapped head is exactly today's z / temperature, a scale costs
nothing), `inv_tau * tanh(cap_scale * z)` with one (inv_tau = softcap / temperature, cap_scale = scale / softcap).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from .keywords import keywords_checked
from .messages import shown
from .scalars import finite_real


def _real(name: str, value: object) -> float:
    real = finite_real(value)
    if real is None:
        raise ValueError(f"{name} must be a finite real number, got {shown(value)}")
    return real


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


LogitTransform.__init__ = keywords_checked(LogitTransform.__init__)  # type: ignore[method-assign]
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
    # Defaults that are plain constants: Dynamo (torch 2.11) cannot wrap a LogitTransform held only in the
    # generated __init__'s defaults (no source to guard on), so None stands for the identity until __post_init__.
    transform: Optional[LogitTransform] = None
    shard: Optional[object] = None  # a vocab_parallel.VocabShard

    def __post_init__(self) -> None:
        if self.transform is None:
            object.__setattr__(self, "transform", IDENTITY)

    @property
    def vocab_size(self) -> int:
        """The whole vocabulary (every shard's rows)."""
        return self.weight.shape[0] if self.shard is None else self.shard.vocab_size

    @property
    def logit_constants(self) -> tuple[float, Optional[float]]:
        """(inv_tau, cap_scale): the softmax's logits are inv_tau * z, or inv_tau * tanh(cap_scale * z) with a
        soft-cap, z = h W^T + b. Computed here, once, so the kernels multiply by constants (no per-tile algebra)."""
        transform = self.transform
        if transform.softcap is None:
            return transform.scale / self.temperature, None
        return transform.softcap / self.temperature, transform.scale / transform.softcap

    def with_tensors(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> "LMHead":
        """The same head with other weight/bias tensors (contiguous, detached, or a shard's local rows)."""
        return replace(self, weight=weight, bias=bias)

    def local(self) -> "LMHead":
        """The head a backend streams: this rank's rows, no shard."""
        return replace(self, shard=None)

    def weight_needs_grad(self) -> bool:
        return self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad)
