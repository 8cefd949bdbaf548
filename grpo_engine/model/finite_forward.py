"""The model's forward outputs, checked finite where the engine reads them: the logits each sampling step draws
from (rollout/hf.py) and the hidden states the log-probs and the loss are computed from (steps/logprobs.py,
steps/packing.py).

The weights themselves are checked when they load and after every optimizer step, so NaN or inf here comes from
the computation: an activation that overflowed its dtype, or code outside the engine that changed what the model
computes (a global forward hook, a patched module). Unchecked, the sampler failed inside torch ("probability
tensor contains either inf, nan or element < 0"), greedy decoding read NaN as the largest logit, and the loss
library refused its `hidden` argument: messages that named no step and no cause.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import LogitsProcessor


SCORED_HIDDEN = "hidden states while scoring the completions"  # what the log-prob and loss forwards give


class NonFiniteForwardError(FloatingPointError):
    """The model's forward gave NaN or inf although its weights are finite."""

    def __init__(self, what: str, step: Optional[int] = None) -> None:
        self.what, self.step = what, step
        where = "" if step is None else f" at step {step}"
        super().__init__(
            f"the model's forward gave NaN or inf {what}{where}, although its weights are finite (they are checked "
            f"when they load and after every optimizer step): an activation overflowed its dtype (try model.dtype "
            f"float32) or code outside the engine changed what the model computes (a global forward hook, a "
            f"patched module); the run stops here, so the last checkpoint stays the one to resume from")

    def at_step(self, step: int) -> "NonFiniteForwardError":
        return NonFiniteForwardError(self.what, step)


def require_finite(values: torch.Tensor, what: str) -> torch.Tensor:
    """`values` (a forward's output the engine reads), or NonFiniteForwardError naming `what` they are."""
    if not bool(torch.isfinite(values).all()):
        raise NonFiniteForwardError(what)
    return values


class FiniteLogits(LogitsProcessor):
    """First of the sampling processors: a row of the model's logits with NaN or +inf, or -inf for every token (-inf
    for some tokens is a model ruling them out itself, which sampling handles), is remembered on the device and
    replaced by zeros, so the sampler draws from it without failing (on CUDA a NaN probability is a device-side
    assert that ends the process); `raise_if_seen` after generate says it, in one line. No host sync per token:
    generate's own stopping check already has one, and this adds none."""

    def __init__(self) -> None:
        self.seen: Optional[torch.Tensor] = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        broken = (torch.isnan(scores).any(-1) | torch.isposinf(scores).any(-1)
                  | torch.isneginf(scores).all(-1))[:, None]
        self.seen = broken.any() if self.seen is None else self.seen | broken.any()
        return scores.masked_fill(broken, 0.0)

    def raise_if_seen(self) -> None:
        if self.seen is not None and bool(self.seen):
            raise NonFiniteForwardError("logits while sampling")
