"""Property test: a misspelt keyword at any public entry point of the loss library is refused before any work by
one line naming the keyword written and, when one is close, the keyword meant ("did you mean 'ref_logps'?").
Python's own error named neither the keyword meant nor, for a constructor bound through a signature, the class."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_kernels import (FusedLinearGRPOLoss, GRPOLossConfig, LogitTransform, fused_linear_grpo_loss,
                          grpo_loss_from_logits, linear_logprobs, register_loss_type)
from grpo_kernels.keywords import accepted_keywords

DERANDOMIZE = bool(os.environ.get("CI"))
B, T, H, V = 2, 3, 4, 7


def _tensors():
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(B, T, H, generator=gen), torch.randn(V, H, generator=gen), torch.randint(0, V, (B, T)),
            torch.ones(B, T), torch.randn(B, generator=gen))


def _entries():
    """(what the refusal names, the keywords it takes, call(**keywords))."""
    hidden, weight, ids, mask, advantages = _tensors()
    module = FusedLinearGRPOLoss(beta=0.0)
    return {
        "fused_linear_grpo_loss": (accepted_keywords(inspect.unwrap(fused_linear_grpo_loss)),
                                   lambda **kw: fused_linear_grpo_loss(hidden, weight, ids, mask, advantages, **kw)),
        "linear_logprobs": (accepted_keywords(inspect.unwrap(linear_logprobs)),
                            lambda **kw: linear_logprobs(hidden, weight, ids, **kw)),
        "grpo_loss_from_logits": (accepted_keywords(inspect.unwrap(grpo_loss_from_logits)),
                                  lambda **kw: grpo_loss_from_logits(torch.randn(B, T, V), ids, mask, advantages,
                                                                     **kw)),
        "GRPOLossConfig": (tuple(inspect.signature(GRPOLossConfig).parameters), lambda **kw: GRPOLossConfig(**kw)),
        "FusedLinearGRPOLoss": (tuple(inspect.signature(FusedLinearGRPOLoss).parameters),
                                lambda **kw: FusedLinearGRPOLoss(**kw)),
        "FusedLinearGRPOLoss.forward": (accepted_keywords(inspect.unwrap(FusedLinearGRPOLoss.forward)),
                                        lambda **kw: module(hidden, weight, ids, mask, advantages, **kw)),
        "LogitTransform": (("scale", "softcap"), lambda **kw: LogitTransform(**kw)),
        "register_loss_type": (accepted_keywords(inspect.unwrap(register_loss_type)),
                               lambda **kw: register_loss_type("typo_probe", lambda x: x.logps, "sequence_mean",
                                                               **kw)),
    }


ENTRIES = _entries()


@st.composite
def misspellings(draw):
    """An entry point, one of its keywords and a misspelling of it (a character dropped, doubled, swapped with the
    next, or changed) that is none of its keywords."""
    entry = draw(st.sampled_from(sorted(ENTRIES)))
    accepted, _ = ENTRIES[entry]
    meant = draw(st.sampled_from([name for name in accepted if len(name) >= 5]))
    at = draw(st.integers(1, len(meant) - 2))
    edit = draw(st.sampled_from(["drop", "double", "swap", "change"]))
    typo = {"drop": meant[:at] + meant[at + 1:], "double": meant[:at] + meant[at] + meant[at:],
            "swap": meant[:at] + meant[at + 1] + meant[at] + meant[at + 2:],
            "change": meant[:at] + ("q" if meant[at] != "q" else "z") + meant[at + 1:]}[edit]
    if typo in accepted or typo == meant:
        typo = meant + "_x"
    return entry, meant, typo


@settings(max_examples=150, deadline=None, derandomize=DERANDOMIZE)
@given(misspellings())
def test_a_misspelt_keyword_is_refused_naming_it_and_the_closest_keyword(case):
    entry, meant, typo = case
    accepted, call = ENTRIES[entry]
    with pytest.raises(TypeError) as caught:
        call(**{typo: None})
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400, message
    assert message.startswith(f"{entry}() got an unexpected keyword argument {typo!r}"), message
    suggested = message.partition("did you mean ")[2].strip("'?")
    assert suggested in accepted, message  # a close keyword that exists (the one meant, or as close a one)
